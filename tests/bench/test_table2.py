"""Table 2 at CPU scale: the committed figures (reports/table2/table2.json) and the code
that makes them from run folders (bench.table2), on a tiny synthetic summary."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench import table2

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "reports" / "table2"


def test_committed_table_has_the_runs_and_compression_above_one() -> None:
    data = json.loads((REPORT / "table2.json").read_text())
    runs = data["runs"]
    assert set(table2.RUNS) <= set(runs) <= set(table2.RUNS + table2.EXTRA)
    assert runs["vgg16-ddp"]["method"] == "ddp" and runs["vgg16-ddp"]["compression_ratio"] == 1.0
    ab = runs["vgg16-ab"]
    assert ab["method"] == "ab" and ab["compression_ratio"] > 1.0
    assert ab["factorizations"] and ab["factorizations"][-1]["compression_ratio"] == pytest.approx(
        ab["compression_ratio"]
    )
    # the same budget for every run, and top-1 clearly above chance
    assert len({(r["steps"], r["global_batch"], r["lr"]) for r in runs.values()}) == 1
    for r in runs.values():
        assert r["val_top1_best"] > 2 * data["chance_top1"]
        assert r["evals"][-1]["val_top1"] == r["val_top1_final"]
    assert ab["delta_top1_best"] == pytest.approx(
        ab["val_top1_best"] - runs["vgg16-ddp"]["val_top1_best"], abs=0.01
    )
    # per layer: A+B = k (out + in) of the matrix view, and the whole-model ratio from them
    for row in ab["layers"]:
        out, inner = row["matrix"]
        assert row["ab_params"] == row["rank"] * (out + inner)
    assert table2.whole_ratio(ab["params_full"], ab["layers"]) == pytest.approx(
        ab["compression_ratio"]
    )
    assert (REPORT / "table2.png").stat().st_size > 10_000
    readme = (REPORT / "README.md").read_text()
    assert f"{ab['compression_ratio']:.2f}:1" in readme


def _run(tmp: Path, name: str, method: str, facts: list, ratio: float, tops: list) -> None:
    d = tmp / name
    d.mkdir()
    summary = dict(
        method=method,
        world_size=2,
        nodes=2,
        steps=20,
        val_top1=dict(best=max(tops), final=tops[-1]),
        compression_ratio=ratio,
        factorizations=facts,
        wall_seconds=1.0,
        traffic=dict(inter_node_bytes=10.0),
        evals=[dict(step=10 * (i + 1), val_top1=t) for i, t in enumerate(tops)],
    )
    cfg = dict(
        batch_size=4,
        optim=dict(lr=1e-3, weight_decay=0.1),
        ab=dict(sigma_cutoff=0.15),
        model=dict(name="vgg16", layout="timm", width=1),
    )
    (d / "summary.json").write_text(json.dumps(summary))
    (d / "config.json").write_text(json.dumps(cfg))


def test_collect_recomputes_the_ratio_and_writes_json_and_figure(tmp_path: Path) -> None:
    shapes = {"conv": [8, 4, 3, 3], "fc": [16, 8]}  # matrices 8x36 and 16x8
    total = 8 * 36 + 16 * 8 + 100  # plus 100 biases and other parameters
    current = total - (8 * 36 - 2 * (8 + 36)) - (16 * 8 - 8 * (16 + 8))
    ratio = total / current
    facts = [dict(step=10, compression_ratio=ratio, ranks={"conv": 2, "fc": 8})]
    _run(tmp_path, "vgg16-ab", "ab", facts, ratio, [20.0, 30.0])
    _run(tmp_path, "vgg16-ddp", "ddp", [], 1.0, [25.0, 35.0])
    data = table2.table(tmp_path, shapes=shapes, total=total)
    assert set(data["runs"]) == {"vgg16-ab", "vgg16-ddp"}  # vit-ab absent: left out
    ab = data["runs"]["vgg16-ab"]
    assert ab["delta_top1_best"] == -5.0 and ab["delta_top1_final"] == -5.0
    assert ab["params_current"] == current
    fc = next(r for r in ab["layers"] if r["layer"] == "fc")
    assert fc["ab_params"] == 8 * 24 and math.isclose(fc["ratio"], 128 / 192)
    table2.figure(data, tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 0

    # a summary whose ratio doesn't match its ranks and the layer shapes is refused
    _run(tmp_path, "vit-ab", "ab", facts, ratio * 1.01, [20.0])
    with pytest.raises(ValueError, match="compression from the layer shapes"):
        table2.table(tmp_path, shapes=shapes, total=total)
