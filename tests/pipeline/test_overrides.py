"""Where a run's values come from: the matrix, the schedule, the search's best, the run's
own `set`, then `experiments.set`, the experiment's explicit values, which win over all."""

from __future__ import annotations

import copy

import pytest
import yaml

from abtrain import config as abconfig
from pipeline import matrix
from tests.helpers import PARAMS

P = yaml.safe_load(PARAMS.read_text())
SIZE = 10_000  # training images: no prepared data needed


def best(lr: float) -> dict:
    return {
        "backend": "propulate",
        "params": {"optim.lr": lr, "ab.warmup_steps": 0.3, "ab.group_size": 1},
    }


def trained(p: dict, name: str, found: dict | None) -> abconfig.Config:
    run = matrix.runs(p)[name]
    return abconfig.from_dict(p["train"], matrix.run_overrides(p, run, found, size=SIZE))


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
    run = matrix.runs(p)["ab-2x2"]
    lines = matrix.provenance(p, matrix.resolve(p, run, best(0.003), size=SIZE))
    lr = next(line for line in lines if line.startswith("optim.lr="))
    assert lr == (
        "optim.lr=0.00123  <- experiments.set; replaces 0.003 from search best (propulate), "
        f"{P['train']['optim']['lr']} from train"
    )
    assert any(line.startswith("ab.warmup_steps=") and "search best" in line for line in lines)


def test_a_value_equal_to_all_it_replaces_prints_no_line():
    p, lr = copy.deepcopy(P), P["train"]["optim"]["lr"]
    run = matrix.runs(p)["ab-2x2"]
    for value, shown in ((lr, False), (lr * 2, True)):
        p["experiments"]["set"] = [f"optim.lr={value}"]
        resolved = matrix.resolve(p, run, None, size=SIZE)
        assert f"optim.lr={value}" in [o.text for o in resolved]  # the run takes it either way
        lines = matrix.provenance(p, resolved)
        assert any(line.startswith("optim.lr=") for line in lines) == shown
    # one that replaces another value on the way (the search's) is printed
    p["experiments"]["set"] = [f"optim.lr={lr}"]
    lines = matrix.provenance(p, matrix.resolve(p, run, best(lr * 3), size=SIZE))
    want = f"optim.lr={lr}  <- experiments.set; replaces {lr * 3} from search best (propulate)"
    assert any(line.startswith(want) for line in lines), lines


@pytest.mark.parametrize(
    ("name", "ab", "psgd"),
    [("ddp-2x2", False, False), ("psgd-2x2", False, True), ("ab-2x2", True, False)],
)
def test_settings_of_a_part_the_method_lacks_are_counted_not_listed(name, ab, psgd):
    p = copy.deepcopy(P)
    rank = P["train"]["powersgd"]["rank"] + 1
    p["experiments"]["set"] = [f"powersgd.rank={rank}"]
    run = matrix.runs(p)[name]
    resolved = matrix.resolve(p, run, best(0.003), size=SIZE)
    lines = matrix.provenance(p, resolved)
    assert any(line.startswith("ab.warmup_steps=") for line in lines) == ab
    assert any(line.startswith("powersgd.rank=") for line in lines) == psgd
    assert any(line.startswith("ab.*: ") for line in lines) != ab
    assert any(line.startswith("powersgd.*: 1 not shown") for line in lines) != psgd
    # only the printout: the run trains with every value
    cfg = trained(p, name, best(0.003))
    assert cfg.powersgd.rank == rank and cfg.ab.warmup_steps == round(0.3 * cfg.steps)


def test_the_runs_left_are_timed_at_the_pace_of_the_finished_ones(tmp_path, monkeypatch):
    import json

    from pipeline import train

    p, runs = copy.deepcopy(P), matrix.runs(P)
    monkeypatch.chdir(tmp_path)  # runs/ and the prepared data's meta.json, made up here
    meta = tmp_path / P["train"]["data"]["prepared"] / "meta.json"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({"counts": {"train": {"a": SIZE}}}))
    assert train.runs_left(p, runs, "ab-2x2", None).endswith(
        "no finished run yet to estimate their time from"
    )
    walls = {"ddp-2x2": 100.0, "psgd-2x2": 200.0}
    for name, wall in walls.items():
        folder = tmp_path / "runs" / "train" / name
        folder.mkdir(parents=True)
        cfg = abconfig.from_dict(p["train"], matrix.run_overrides(p, runs[name], None))
        (folder / "config.json").write_text(json.dumps(cfg.dump()))
        (folder / "summary.json").write_text(json.dumps({"wall_seconds": wall}))
    left = len(runs) - len(walls)
    mean = sum(walls.values()) / len(walls)
    assert train.runs_left(p, runs, "ab-2x2", None) == (
        f"[pipeline] runs of the matrix not finished: {left} (this one included), about "
        f"{train.duration(left * mean)} of training (launches not counted) at the pace of the "
        f"2 finished ({train.duration(mean)} each on average)"
    )
    p["train"]["optim"]["lr"] *= 2  # the folders hold another config's runs: not finished
    assert f"not finished: {len(runs)} " in train.runs_left(p, runs, "ab-2x2", None)


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
