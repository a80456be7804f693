"""Seed spread (bench.seeds): the summary arithmetic and the written report, on synthetic
run folders (no training)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from bench import seeds

TOP1 = {"ddp-2x2": (33.0, 31.0, 32.0), "ab-2x2": (30.5, 31.5, 29.0)}


def fake_runs(root: Path) -> None:
    for name, values in TOP1.items():
        for seed, best in enumerate(values):
            out = root / f"{name}-s{seed}"
            out.mkdir(parents=True)
            summary = dict(
                method=name.split("-")[0],
                steps=156,
                world_size=4,
                nodes=2,
                val_top1=dict(best=best, final=best - 0.5),
                traffic=dict(inter_node_bytes=1e9 if name.startswith("ddp") else 4e8),
                wall_seconds=60.0 + seed,
            )
            (out / "summary.json").write_text(json.dumps(summary))


def test_summary_arithmetic_and_report(tmp_path: Path) -> None:
    fake_runs(tmp_path / "runs")
    data = seeds.report(
        ("ddp-2x2", "ab-2x2"), (0, 1, 2), tmp_path / "runs", tmp_path / "out", "cmd"
    )
    s = data["summary"]
    ddp = s["methods"]["ddp-2x2"]["best_top1"]
    assert ddp["mean"] == pytest.approx(32.0) and ddp["std"] == pytest.approx(1.0)
    assert (ddp["min"], ddp["max"], ddp["range"]) == (31.0, 33.0, 2.0)
    assert s["methods"]["ab-2x2"]["final_top1"]["mean"] == pytest.approx(89.5 / 3)
    diff = s["difference"]
    assert diff["per_seed"] == pytest.approx({"0": -2.5, "1": 0.5, "2": -3.0})
    assert diff["spread"]["mean"] == pytest.approx(-5.0 / 3)
    assert diff["spread"]["std"] == pytest.approx(statistics.stdev([-2.5, 0.5, -3.0]))
    # written atomically (no .tmp left), and the README's figures come from the JSON
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["README.md", "seeds.json"]
    assert json.loads((tmp_path / "out" / "seeds.json").read_text())["summary"] == s
    text = (tmp_path / "out" / "README.md").read_text()
    assert "| Δ | -2.50 | +0.50 | -3.00 | -1.67 | -3.00 | +0.50 | 1.89 |" in text
    assert "| ddp-2x2 | 3 | 32.00 | 31.00 | 33.00 | 2.00 | 1.00 |" in text


def test_missing_seed_is_left_out_of_the_difference(tmp_path: Path) -> None:
    fake_runs(tmp_path)
    (tmp_path / "ab-2x2-s2" / "summary.json").unlink()
    s = seeds.summarize(
        seeds.collect(("ddp-2x2", "ab-2x2"), (0, 1, 2), tmp_path), "ddp-2x2", "ab-2x2"
    )
    assert list(s["difference"]["per_seed"]) == ["0", "1"]
    assert s["methods"]["ab-2x2"]["best_top1"]["n"] == 2


def test_a_pair_other_than_ab_is_named_as_itself_and_says_how_it_was_trained(tmp_path: Path):
    fake_runs(tmp_path / "runs")
    for seed in range(3):  # abps: the ab runs' figures under another name
        (tmp_path / "runs" / f"ab-2x2-s{seed}").rename(tmp_path / "runs" / f"abps-2x2-s{seed}")
    data = seeds.report(
        ("ddp-2x2", "abps-2x2"), (0, 1, 2), tmp_path / "runs", tmp_path / "out", "cmd", True
    )
    assert data["search_best_values"] is True
    text = (tmp_path / "out" / "README.md").read_text()
    assert "**with** the hyperparameter search's best values" in text
    assert "paired abps-2x2 − ddp-2x2 difference spans -3.00 to +0.50" in text
    assert "abps-2x2 is below ddp-2x2 at 2 of 3 seeds" in text


def test_a_pair_without_ddp_sets_no_gap_to_ddp_beside_its_own(tmp_path: Path):
    """A study of ab-2x2 against localsgd-ab-2x2 (the matched ablation) measures another
    quantity than the report's gap to ddp: it names none, where a study against ddp does."""
    fake_runs(tmp_path / "runs")
    for seed in range(3):
        (tmp_path / "runs" / f"ddp-2x2-s{seed}").rename(
            tmp_path / "runs" / f"localsgd-ab-2x2-s{seed}"
        )
    against = {}
    for base in ("ddp-2x2", "localsgd-ab-2x2"):
        if base == "ddp-2x2":
            fake_runs(tmp_path / "runs-ddp")
        runs = tmp_path / ("runs-ddp" if base == "ddp-2x2" else "runs")
        data = seeds.report((base, "ab-2x2"), (0, 1, 2), runs, tmp_path / base, "cmd", True)
        against[base] = data["headline_diff_top1"]
    assert against["localsgd-ab-2x2"] is None
    text = (tmp_path / "localsgd-ab-2x2" / "README.md").read_text()
    assert "The committed report's" not in text and "not the report's configuration" not in text
    assert "These are the report's localsgd-ab-2x2 and ab-2x2 runs, at 3 seeds" in text
    assert against["ddp-2x2"] is not None  # the committed table 2's ab-2x2 row
