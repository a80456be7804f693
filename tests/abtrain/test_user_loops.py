"""AB training in users' own loops, as users write them, under torchrun on 2 ranks
(tests/abtrain/user_loops.py, one torchrun for every case): a factorised layer's weight read
by paths the survey cannot see, a loop that keeps its losses, the guards on the first calls,
a chainable LR scheduler, DDP's own arguments; and `abtrain train --set steps=60`."""

import json
import subprocess
import sys

import pytest

from tests.helpers import PARAMS, ROOT, TINY

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def seen(tmp_path_factory):
    out = tmp_path_factory.mktemp("loops")
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        str(ROOT / "tests" / "abtrain" / "user_loops.py"), str(out),
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    def read(case: str, rank: int = 0) -> dict:
        result = json.loads((out / f"{case}-rank-{rank}.json").read_text())
        assert "error" not in result, result["error"]
        return result

    return read


@pytest.mark.parametrize("path", ["alias", "helper", "method", "getattr"])
def test_a_weight_read_the_survey_cannot_see_trains_what_the_layer_trains(seen, path):
    for rank in (0, 1):
        r = seen(f"reads-{path}", rank)
        if not r["factorised"]:  # caught by the survey: kept full rank, the reader named
            assert "read" in r["kept"], r
            continue
        # the reader gets A·B as the factors are now, not the W frozen at the phase's start
        assert r["served_vs_product"] == 0.0, r
        assert r["moved"] > 1e-4, r  # the factors trained, and the read followed them
        assert r["stale_w_vs_product"] > 1e-4, r  # what it would have read before
        assert r["read_grad"] > 0, r  # its gradient reaches the trained factor
    assert seen(f"reads-{path}")["factorised"], "no path of the four is seen by the survey"


def test_a_loop_that_keeps_its_losses_trains_through_every_change_of_rank(seen):
    r = seen("kept-losses")
    assert r["factorizations"] >= 2, r
    ranks = [tuple(f.values()) for f in r["ranks"]]
    assert len(set(ranks)) > 1, f"the ranks never changed, nothing was tested: {ranks}"
    assert len(r["losses"]) == 24 and all(loss == loss for loss in r["losses"])


def test_the_first_calls_are_guarded(seen):
    r = seen("guards")
    assert "before the first module()" in r["full_rank_model_first"], r
    assert "module(10) as the first call" in r["first_module_10"], r
    assert "load_state_dict" in r["first_module_10"], r
    assert r["resumed_at_8"] == "ab", r  # a loaded state may continue at any step


def test_a_chainable_scheduler_gets_the_rebound_once_at_every_step(seen):
    r = seen("scheduler")
    assert r["used"] == pytest.approx(r["wanted"], rel=1e-9, abs=0), list(
        zip(r["used"], r["wanted"])
    )
    # the naive product compounds: the test would see it
    assert r["naive"][-1] < 0.5 * r["wanted"][-1] or r["naive"] != pytest.approx(r["wanted"])


def test_ddps_own_arguments_pass_through_and_abtrains_are_refused(seen):
    r = seen("unused-layer")
    assert "process_group is set by ABTraining itself" in r["refused"], r
    assert r["factorizations"] >= 2, r


def test_a_shorter_run_of_the_default_params_keeps_its_shape(tmp_path):
    """`abtrain train --set steps=60` on params.yaml: its phases are fractions of steps."""
    schedule = ("optim.lr_warmup_steps", "ab.warmup_steps", "ab.ab_steps", "ab.rebound_steps",
                "ab.lr_rebound_steps", "eval_every", "checkpoint_every", "steps")  # fmt: skip
    sets = [s for s in TINY if not s.startswith(schedule)]
    cmd = [sys.executable, "-m", "abtrain.launch", "--nnodes=2", "--nproc-per-node=1", "train",
           "--config", str(PARAMS), "--out", str(tmp_path / "run"), "--set", "steps=60",
           "--set", "eval_every=30", "--set", "checkpoint_every=0"]  # fmt: skip
    for s in sets:
        cmd += ["--set", s]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())
    # 0.2, 0.1, 0.025 and 0.05 of 60 steps, as of 400
    assert (cfg["ab"]["warmup_steps"], cfg["ab"]["ab_steps"], cfg["ab"]["rebound_steps"]) == (
        12, 6, 2)  # fmt: skip
    assert cfg["ab"]["lr_rebound_steps"] == 3  # the LR's warm-up stays 20 steps, as written
    assert cfg["optim"]["lr_warmup_steps"] == 20
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 60 and len(summary["factorizations"]) >= 2
