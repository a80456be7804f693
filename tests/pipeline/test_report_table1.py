"""The report compares GB/s with GB/s: AB's inter-node rate over wall time against DDP's,
split into named parts that add up."""

import json

import pytest

from pipeline.report import tables
from pipeline.report.paper import paper_scale_rates


def summary(method, by_phase, wall):
    run = dict(nodes=2, ranks_per_node=2, batch="local", global_batch=128, model="vit", data="x")
    inter = sum(by_phase.values())
    return dict(
        method=method,
        steps=100,
        wall_seconds=wall,
        run=run,
        traffic=dict(
            inter_node_bytes=inter,
            total_bytes=inter,
            by_phase={k: dict(inter=v, intra=0.0, total=v) for k, v in by_phase.items()},
        ),
    )


def test_table1_sets_the_rate_ratio_beside_the_byte_ratio_and_splits_it():
    done = {
        "ddp": summary("ddp", {"full": 1000.0, "setup": 10.0}, wall=50.0),
        "ab": summary(
            "ab", {"warmup": 300.0, "rebound": 60.0, "sync": 40.0, "ab": 0.0, "eval": 5.0}, 80.0
        ),
    }
    rows = {r["run"]: r for r in tables.table1(done)}
    ab = rows["ab"]
    assert ab["ratio_to_ddp"] == pytest.approx(405 / 1010)
    assert ab["rate_ratio_to_ddp"] == pytest.approx((405 / 80) / (1010 / 50))
    parts = ab["part_full_rank_steps"] + ab["part_syncs"] + ab["part_ab_steps"] + ab["part_other"]
    assert parts == pytest.approx(ab["ratio_to_ddp"])
    assert ab["part_full_rank_steps"] == pytest.approx(360 / 1010)
    assert ab["ratio_to_ddp"] * ab["time_factor"] == pytest.approx(ab["rate_ratio_to_ddp"])
    assert rows["ddp"]["rate_ratio_to_ddp"] == pytest.approx(1.0)


def test_the_paper_scale_table_sets_predicted_gb_per_s_beside_table_1(monkeypatch):
    """From the committed bench/results/paper_scale.json: one row per AB run of the paper
    profile, its GB/s ratio beside the paper's; parts and ratios read as they should."""
    from tests.helpers import ROOT

    monkeypatch.setattr(tables, "PAPER_SCALE", ROOT / "bench/results/paper_scale.json")
    paper = json.loads((ROOT / "pipeline/paper_reference.json").read_text())
    md = paper_scale_rates(paper)
    rows = [line.split(" | ") for line in md if line.startswith("| ViT-B/16 |")]
    rows += [line.split(" | ") for line in md if line.startswith("| ResNet-50 |")]
    assert len(rows) == 18  # 2 models × (5 local + 4 global)
    for r in rows:
        rate, byte_ratio, group_bn = float(r[6]), float(r[8]), float(r[9])
        lo, hi = (float(x) for x in r[7].split("–"))
        assert lo <= rate <= hi  # the band holds the single figure
        full_rank, ab_steps, syncs, other = (float(x) for x in r[10:14])
        assert byte_ratio < rate < 1.0  # AB's own steps don't wait for the network
        assert " ± " in r[-1]  # the paper's ratio with its spread
        assert full_rank + ab_steps + syncs + other == pytest.approx(byte_ratio, abs=2e-3)
        if r[0] == "| ViT-B/16":  # no BatchNorm: nothing crosses in an AB step
            assert ab_steps == 0 and group_bn == rate
        else:  # the authors' SyncBatchNorm over the world costs AB more than per group
            assert ab_steps > 0 and group_bn < rate
    assert "Nothing is fitted" in " ".join(md)


def test_ecr_star_needs_no_run_folder(tmp_path, monkeypatch):
    """The run folders are not committed: on a clone without them the report's ECR* comes
    from the config the train stage resolves, the same as the folder's config.json."""
    from pipeline.stage import params
    from tests.helpers import ROOT

    monkeypatch.chdir(ROOT)
    p = params()
    done = {
        n: json.loads((tables.RESULTS / f"{n}.json").read_text()) for n in ("ddp-2x2", "ab-2x2")
    }
    monkeypatch.setattr(tables, "RUNS", tmp_path / "no-runs")
    row = next(r for r in tables.table2(done, p) if r["run"] == "ab-2x2")
    cfg = tables.run_config(p, "ab-2x2")
    assert cfg.method == "ab" and cfg.steps == done["ab-2x2"]["steps"]
    assert row["ecr_groups"] == pytest.approx(tables.ecr_groups(cfg)) and row["ecr_groups"] > 0
    assert tables.run_config(p, "not-a-run") is None
