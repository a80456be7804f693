"""What a run keeps grows with its steps alone, by a small constant, and a checkpoint holds
each distinct state once: checked on real 2 × 2 runs with many gradient buckets."""

import pytest

from abtrain.distributed import ledger
from abtrain.run import checkpointer
from bench.footprint import checkpoint_bytes, kept_bytes, one_copy_bytes
from tests.helpers import launch, summary, tiny_config

pytestmark = pytest.mark.multiprocess  # real 2 x 2 runs through the launcher

# A deeper MLP with one bucket per parameter: many collectives per step, as ViT-B/16's
# 14 buckets are at scale; per-collective rows off, as in a real run.
MANY_BUCKETS = [
    "model={name: mlp, width: 64, depth: 8, init: default}",
    "dist.bucket_cap_mb=0.001",
    "tracking.ledger_rows=false",
]


@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory):
    out = {}
    for steps in (40, 80):
        d = tmp_path_factory.mktemp(f"ddp{steps}")
        proc = launch(d, "method=ddp", f"steps={steps}", *MANY_BUCKETS)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[steps] = d
    return out


def test_run_folder_and_checkpoint_grow_by_at_most_600_bytes_a_step(ddp_runs):
    short, long = ddp_runs[40], ddp_runs[80]
    rows = ledger.read_csv(long / "ledger.csv")
    calls = sum(r["calls"] for r in rows if r["phase"] == "full" and r["op"] == "all_reduce")
    assert calls >= 80 * 10  # the buckets really are many: at least 10 all-reduces a step
    assert not (long / "ledger.jsonl").exists() and not (long / "ledger").exists()
    per_step = (kept_bytes(long) - kept_bytes(short)) / 40
    assert 0 < per_step <= 600, per_step
    growth = (checkpoint_bytes(long, 80) - checkpoint_bytes(short, 40)) / 40
    assert growth <= 600, growth


def test_ddp_checkpoint_is_one_copy_of_model_and_optimizer(ddp_runs):
    d = ddp_runs[40]
    names = sorted(p.name for p in checkpointer.step_dir(d / "checkpoints", 40).iterdir())
    assert names == [
        "meta.json",
        "rank_0.pt",
        "rank_1.pt",
        "rank_2.pt",
        "rank_3.pt",
        "replica_0.pt",
    ]
    ratio = checkpoint_bytes(d, 40) / one_copy_bytes(tiny_config("method=ddp", *MANY_BUCKETS))
    assert ratio <= 1.6, ratio


def test_ledger_csv_sums_to_the_summary(ddp_runs):
    d = ddp_runs[80]
    rows, s = ledger.read_csv(d / "ledger.csv"), summary(d)
    inter = sum(r["inter_bytes"] for r in rows) / s["world_size"]
    assert inter == pytest.approx(s["traffic"]["inter_node_bytes"], rel=1e-12)
    assert {r["step"] for r in rows} == set(range(81))  # every step, once per flush window
    shares = s["time"]["share"]
    assert set(shares) == {"data", "compute", "comm", "svd", "wrap", "eval", "checkpoint"}
    assert sum(shares.values()) == pytest.approx(1.0)
    assert s["time"]["by_phase"]["full"]["steps"] == 80
