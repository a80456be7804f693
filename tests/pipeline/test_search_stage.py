"""The search stage's inputs: dvc.yaml tracks exactly the keys of `train` its runs read, and
the stage refuses bad settings, or an edit that leaves a key it reads untracked, in one line
before mpirun starts (through DVC: tests/pipeline/test_pipeline.py)."""

import copy

import pytest
import yaml

from abtrain.config import ConfigError
from pipeline import search, stage
from tests.helpers import ROOT

DEFAULT = yaml.safe_load((ROOT / "params.yaml").read_text())
PAPER = yaml.safe_load((ROOT / "profiles" / "paper.yaml").read_text())
TRACKED = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["search"]["do"]["params"]


@pytest.mark.parametrize("p", [DEFAULT, PAPER], ids=["default", "paper"])
def test_every_key_the_search_reads_is_tracked(p, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert search.untracked_inputs(p) == []


def test_a_value_the_space_or_search_train_sets_is_not_an_input():
    """`-S train.optim.lr=...` for a run does not rerun the search: the space sets lr."""
    inputs = search.search_inputs(DEFAULT)
    assert {"optim.lr", "optim.weight_decay", "ab.sigma_cutoff", "steps", "method"}.isdisjoint(
        inputs
    )
    assert {"optim.betas", "optim.label_smoothing", "seed", "model.kwargs.depth"} <= inputs
    tracked = [x.removeprefix("train.") for x in TRACKED if x.startswith("train.")]
    for key in [*DEFAULT["search"]["space"], "method", "steps", "eval_every", "tracking.uri"]:
        assert not any(key == t or key.startswith(t + ".") for t in tracked), key


def test_an_edit_that_leaves_an_input_untracked_is_refused_in_one_line(monkeypatch):
    monkeypatch.chdir(ROOT)
    p = copy.deepcopy(DEFAULT)
    del p["search"]["space"]["optim.lr"]  # lr is now train's: a search input DVC doesn't see
    p["search"]["use_best"].remove("optim.lr")
    assert search.untracked_inputs(p) == ["optim.lr"]
    with pytest.raises(ConfigError) as err:
        search.check(p, ["--backend", "propulate", "--out", "unused"])
    assert "train.optim.lr" in str(err.value) and "\n" not in str(err.value)


def test_a_bad_budget_is_one_line_with_the_key_and_no_mpirun(tmp_path, monkeypatch, capsys):
    p = copy.deepcopy(DEFAULT)
    p["search"]["evaluations"] = 0
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(p))
    monkeypatch.chdir(tmp_path)
    started = []
    monkeypatch.setattr(search, "run_mpirun", lambda *a: started.append(a) or 0)
    assert stage.stage(search.main, "propulate") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "[pipeline] error: invalid search config: search.evaluations: "
        "Input should be greater than or equal to 1"
    ]
    assert started == [] and not (tmp_path / "results").exists()


def test_every_stage_ends_a_config_error_in_one_line(tmp_path, monkeypatch, capsys):
    from pipeline import prepare, train

    p = copy.deepcopy(DEFAULT)
    p["train"]["data"]["image_size"] = -3
    p["train"]["batch_size"] = 0
    p["search"]["use_best"] = []  # no search record here
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(p))
    monkeypatch.chdir(tmp_path)
    for main, args in ((prepare.main, ()), (train.main, ("ddp-2x2",))):
        assert stage.stage(main, *args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("[pipeline] error: "), err
        assert "image_size" in err[0] or "batch_size" in err[0], err
    assert list(tmp_path.iterdir()) == [tmp_path / "params.yaml"]  # nothing written
