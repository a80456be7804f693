"""Where a run's values come from: the matrix, the schedule, the search's best, the run's
own `set`, then `experiments.set`, the experiment's explicit values, which win over all."""

from __future__ import annotations

import copy

import pytest
import yaml

from abtrain import config as abconfig
from pipeline import common
from tests.conftest import PARAMS

P = yaml.safe_load(PARAMS.read_text())
SIZE = 10_000  # training images: no prepared data needed


def best(lr: float) -> dict:
    return {
        "backend": "propulate",
        "params": {"optim.lr": lr, "ab.warmup_steps": 0.3, "ab.group_size": 1},
    }


def trained(p: dict, name: str, found: dict | None) -> abconfig.Config:
    run = common.runs(p)[name]
    return abconfig.from_dict(p["train"], common.run_overrides(p, run, found, size=SIZE))


def test_the_experiments_value_wins_over_every_best_the_search_finds():
    p = copy.deepcopy(P)
    p["experiments"]["set"] = ["optim.lr=0.00123", "ab.ab_steps=7"]
    # a search that reruns (for any other change) finds another best: the value stays
    for lr in (0.003, 0.0005):
        cfg = trained(p, "ab-2x2", best(lr))
        assert cfg.optim.lr == 0.00123 and cfg.ab.ab_steps == 7
        assert cfg.ab.warmup_steps == round(0.3 * cfg.steps)  # the rest of the best stays
    assert trained(p, "ab-2x2", None).optim.lr == 0.00123  # and without the search


def test_without_it_the_search_wins_over_train():
    p = copy.deepcopy(P)
    p["train"]["optim"]["lr"] = 0.00123  # `-S train.optim.lr`: the search samples lr
    assert trained(p, "ab-2x2", best(0.003)).optim.lr == 0.003
    assert trained(p, "ab-2x2", None).optim.lr == 0.00123


def test_the_experiments_value_wins_over_a_runs_own_set():
    p = copy.deepcopy(P)
    p["experiments"]["runs"]["ab-2x2"]["set"] = ["optim.lr=0.004", "optim.weight_decay=0.2"]
    p["experiments"]["set"] = ["optim.lr=0.00123"]
    cfg = trained(p, "ab-2x2", best(0.003))
    assert cfg.optim.lr == 0.00123 and cfg.optim.weight_decay == 0.2


def test_every_overridden_value_names_its_source_and_what_it_replaced():
    p = copy.deepcopy(P)
    p["experiments"]["set"] = ["optim.lr=0.00123"]
    run = common.runs(p)["ab-2x2"]
    lines = common.provenance(p, common.resolve(p, run, best(0.003), size=SIZE))
    lr = next(line for line in lines if line.startswith("optim.lr="))
    assert lr == (
        "optim.lr=0.00123  <- experiments.set; replaces 0.003 from search best (propulate), "
        f"{P['train']['optim']['lr']} from train"
    )
    assert any(line.startswith("ab.warmup_steps=") and "search best" in line for line in lines)


@pytest.mark.parametrize(
    ("sets", "named"),
    [
        (["steps=10"], "experiments.set: steps is derived"),
        (["method=ddp"], "experiments.set: method is derived"),
        ("optim.lr=0.1", "must be a list"),
        (["optim.nope=1"], "optim.nope"),
    ],
)
def test_bad_experiment_values_stop_naming_the_key(sets, named):
    p = copy.deepcopy(P)
    p["experiments"]["set"] = sets
    with pytest.raises(abconfig.ConfigError, match=named):
        trained(p, "ab-2x2", None)


def test_only_the_keys_use_best_names_come_from_the_search():
    p = copy.deepcopy(P)
    p["search"]["use_best"] = ["ab.warmup_steps"]
    cfg = trained(p, "ab-2x2", best(0.003))
    assert cfg.optim.lr == P["train"]["optim"]["lr"]  # not carried: train's
    assert cfg.ab.warmup_steps == round(0.3 * cfg.steps)  # carried
    p["search"]["use_best"] = []
    assert trained(p, "ab-2x2", best(0.003)).ab.warmup_steps != round(0.3 * cfg.steps)


@pytest.mark.parametrize(
    ("keys", "named"),
    [
        (["optim.nope"], "use_best: optim.nope is not a key of search.space"),
        (["ab.group_size"], "use_best: ab.group_size is tied to the search workers' shape"),
    ],
)
def test_use_best_names_keys_of_the_space(keys, named):
    from search import space

    raw = copy.deepcopy(P["search"])
    raw["use_best"] = keys
    with pytest.raises(space.SpaceError, match=named):
        space.load(raw)
