"""The training-length study's machinery (bench.lengths): its plan, a miniature of two short
lengths trained for real, killed and continued, and the verdict's sentence made from its
files. The study itself (hours) is not run here."""

import json
import os
import re
import signal
import subprocess
import sys

import pytest
import yaml

from abtrain.config import apply_overrides
from bench import lengths
from pipeline.report.verdict import lengths_line
from tests.helpers import ROOT, TINY


def row(epochs, seed, method, best, compression=1.0, nbytes=100.0):
    return dict(
        epochs=epochs,
        seed=seed,
        method=method,
        name=f"{method}-2x2",
        folder="x",
        steps=10 * epochs,
        best_top1=best,
        final_top1=best,
        inter_node_bytes=nbytes,
        compression_ratio=compression,
        compression_over_steps=[(2, compression)] if method != "ddp" else [],
        kept_fraction_over_steps=[(2, 0.5)] if method != "ddp" else [],
        wall_seconds=1.0,
        evals=[],
        step_seconds={},
    )


def study(short_gap, long_gap, compression=0.8):
    rows = []
    for epochs, gap in ((2, short_gap), (8, (short_gap + long_gap) / 2), (32, long_gap)):
        for seed, noise in ((0, -0.1), (1, 0.0), (2, 0.1)):
            rows.append(row(epochs, seed, "ddp", 30.0 + noise))
            rows.append(row(epochs, seed, "ab", 30.0 + gap + noise / 2, compression, 40.0))
    return lengths.summarize(rows)


def test_the_summary_pairs_each_method_with_ddp_at_its_seed():
    s = study(-3.0, -1.0)
    assert [x["epochs"] for x in s] == [2, 8, 32]
    ab = s[0]["methods"]["ab"]
    assert ab["diff_top1"]["n"] == 3 and ab["diff_top1"]["mean"] == pytest.approx(-3.0)
    assert ab["diff_top1"]["sd"] == pytest.approx(0.05)
    assert ab["bytes_vs_ddp"] == pytest.approx(0.4) and ab["kept_fraction"] == 0.5


@pytest.mark.parametrize(
    ("short", "long", "word"),
    [(-3.0, -1.0, "narrows"), (-1.0, -3.0, "widens"), (-2.0, -2.02, "holds")],
)
def test_the_verdict_says_whether_the_gap_narrows_holds_or_widens(short, long, word):
    text = lengths.verdict(study(short, long))
    assert f"From 2 to 32 epochs AB's gap to DDP {word} " in text
    assert f"({short:+.2f} ± 0.05 to {long:+.2f} ± 0.05 points of best top-1, 3 and 3 seeds" in text
    assert "would make it" not in text  # every length says the same
    assert text.endswith("At 32 epochs AB does not compress (0.80:1, 50% of the rank kept).")
    assert "compresses the model 2.50:1, 50% of the rank kept." in lengths.verdict(
        study(short, long, 2.5)
    )


def test_a_trend_that_only_the_shortest_point_makes_is_not_called_one():
    """The committed study's shape: the 1-epoch gap near 0, the others apart from it but
    not from each other (within their sds): the verdict says `holds` from the second length
    and names the first as what alone would make it widen."""
    rows = []
    for epochs, gap, spread in ((1, -0.2, 0.7), (4, -2.35, 1.1), (16, -3.2, 0.2)):
        for seed, noise in ((0, -1.0), (1, 0.0), (2, 1.0)):
            rows.append(row(epochs, seed, "ddp", 28.0))
            rows.append(row(epochs, seed, "ab", 28.0 + gap + noise * spread))
    text = lengths.verdict(lengths.summarize(rows))
    assert "widens" not in text
    assert text.startswith("From 4 to 16 epochs AB's gap to DDP holds (-2.35 ± 1.10 to -3.20")
    assert "only the 1-epoch point (10 steps, -0.20 ± 0.70) would make it widen" in text
    assert "of final top-1" in text  # the final top-1's gap beside the best's


def test_the_committed_verdict_is_made_from_the_studys_files():
    path = ROOT / "reports" / "lengths" / "lengths.json"
    if not path.exists():
        pytest.skip("the study has not been committed yet")
    data = json.loads(path.read_text())
    assert data["verdict"] == lengths.verdict(data["summary"])
    assert data["verdict"] in (ROOT / "reports" / "lengths" / "README.md").read_text()
    # and the verdict at the top of the report and the README says it
    said = "\n".join(lengths_line(data["verdict"]))  # its head and a line a sentence
    for page in (ROOT / "reports" / "README.md", ROOT / "README.md"):
        assert f"\n{said}\n" in page.read_text(), page


def miniature(root):
    """A profile whose 2 x 1 runs of ddp, ab and powersgd train a small MLP on generated data: one
    epoch is 40 steps; the committed wall times the estimates scale are written too."""
    p = yaml.safe_load((ROOT / "params.yaml").read_text())
    p["train"] = apply_overrides(p["train"], [*TINY, "data.train_samples=320", "batch_size=4"])
    p["search"]["use_best"] = []
    p["experiments"].update(epochs=1, seeds=1, set=[])
    p["experiments"]["runs"] = {
        "ddp-2x1": {"method": "ddp", "nodes": 2, "ranks_per_node": 1, "batch": "local"},
        "ab-2x1": {"method": "ab", "nodes": 2, "ranks_per_node": 1, "batch": "local"},
        "psgd-2x1": {"method": "powersgd", "nodes": 2, "ranks_per_node": 1, "batch": "local"},
    }
    (root / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))
    (root / "results").mkdir()
    for name in p["experiments"]["runs"]:
        (root / "results" / f"{name}.json").write_text(json.dumps({"wall_seconds": 5.0}))
    return p


def test_the_plan_scales_each_run_as_the_pipeline_would(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    p = miniature(tmp_path)
    runs = lengths.list_runs(p, None, (1, 4), (2, 1), ("ddp", "ab"), tmp_path / "runs", (2, 1))
    assert [(r["epochs"], r["seed"], r["method"]) for r in runs] == [
        (1, 0, "ddp"), (1, 0, "ab"), (1, 1, "ddp"), (1, 1, "ab"), (4, 0, "ddp"), (4, 0, "ab"),
    ]  # fmt: skip
    sets = {r["epochs"]: dict(s.split("=", 1) for s in r["sets"]) for r in runs}
    assert sets[1]["steps"] == "40" and sets[4]["steps"] == "160"
    # the schedule, the same fractions of each length (pipeline.matrix.resolve)
    assert int(sets[4]["ab.warmup_steps"]) == 4 * int(sets[1]["ab.warmup_steps"])
    assert sets[4]["eval_every"] == str(160 // lengths.EVALUATIONS)
    assert lengths.estimate(p, runs, tmp_path / "results")[-1] == lengths.LAUNCH_SECONDS + 20.0


@pytest.mark.multiprocess  # the launcher and torchrun, 2 ranks a run
def test_a_killed_study_continues_and_reports_from_its_files(tmp_path):
    miniature(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "bench.lengths", "--epochs", "1", "2", "--seeds", "2", "1"]
    cmd += ["--methods", "ddp", "ab", "--shape", "2x1"]
    errors = (tmp_path / "first.err").open("w+")  # a file: the runs' lines can't fill it
    first = subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=errors, text=True,
        start_new_session=True,
    )  # fmt: skip
    said = []
    for line in first.stdout:
        said.append(line)
        if line.startswith("[bench.lengths] run 3 of 6:"):  # two finished: Ctrl-C
            os.killpg(first.pid, signal.SIGINT)  # as a terminal sends it: to the whole group
            break
    first.communicate(timeout=120)
    errors.seek(0)
    err = errors.read()
    assert "the rest about" in said[0] and "ETA" in said[1]
    assert err.strip().splitlines()[-1] == (
        "[bench] stopped (Ctrl-C); what finished is kept, and the same command goes on from there"
    ), err[-2000:]
    again = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    out = again.stdout
    assert "run 1 of 6: finished, read from runs/lengths/e1/ddp-2x1-s0" in out
    assert "run 2 of 6: finished, read from runs/lengths/e1/ab-2x1-s0" in out
    assert "run 6 of 6: ab-2x1 at 2 epochs, seed 0" in out
    data = json.loads((tmp_path / "reports" / "lengths" / "lengths.json").read_text())
    assert [s["epochs"] for s in data["summary"]] == [1, 2]
    assert data["summary"][0]["methods"]["ab"]["diff_top1"]["n"] == 2
    assert data["summary"][1]["steps"] == 80
    assert (
        data["shape"] == [2, 1]
        and "2 × 1 run" in (tmp_path / "reports/lengths/README.md").read_text()
    )
    ab = next(r for r in data["runs"] if r["method"] == "ab" and r["epochs"] == 2)
    assert ab["kept_fraction_over_steps"] and ab["compression_over_steps"]
    assert set(data["time_to_target"]["seconds"]) == {"ddp", "ab"}
    assert data["verdict"] == lengths.verdict(data["summary"]) and data["verdict"] in out
    assert (tmp_path / "reports" / "lengths" / "lengths.png").stat().st_size > 10_000
    # the run folders stay on the machine that trained them: --render redraws the same page,
    # figure and verdict from the committed lengths.json alone
    made = {
        f: (tmp_path / "reports/lengths" / f).read_bytes()
        for f in os.listdir(tmp_path / "reports/lengths")
    }
    subprocess.run(["rm", "-rf", str(tmp_path / "runs")], check=True)
    redrawn = subprocess.run(
        [sys.executable, "-m", "bench.lengths", "--render"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert redrawn.returncode == 0, redrawn.stderr[-3000:]
    assert redrawn.stdout.strip() == data["verdict"]
    for f, content in made.items():
        assert (tmp_path / "reports/lengths" / f).read_bytes() == content, f
    # and a clone adds a method by training its runs alone: the others, their folders gone,
    # are read from the committed lengths.json
    more = [sys.executable, "-m", "bench.lengths", "--epochs", "1", "2", "--seeds", "1", "1"]
    more += ["--methods", "ddp", "ab", "powersgd", "--shape", "2x1"]
    added = subprocess.run(more, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert added.returncode == 0, added.stdout[-3000:] + added.stderr[-3000:]
    trained = re.findall(r"run \d of 6: (\S+) at (\d) epochs", added.stdout)
    assert trained == [("psgd-2x1", "1"), ("psgd-2x1", "2")], added.stdout
    assert added.stdout.count("finished, read from lengths.json") == 4
    now = json.loads((tmp_path / "reports" / "lengths" / "lengths.json").read_text())
    kept = [r for r in data["runs"] if r["seed"] == 0]
    assert [r for r in now["runs"] if r["method"] != "powersgd"] == kept
    # the time to target sets no step times of two sessions side by side
    assert set(now["time_to_target"]["seconds"]) == {"ddp", "ab"}
    assert now["time_to_target"]["left_out"] == ["powersgd"]
    assert "Not in this table: powersgd" in (tmp_path / "reports/lengths/README.md").read_text()
    assert now["summary"][1]["methods"]["powersgd"]["diff_top1"]["n"] == 1


def test_the_figure_gives_each_points_seeds_in_its_legend_not_over_the_markers(monkeypatch):
    """At one length the methods' points sit close: the n's are in the legend, one per
    length in order, and no text is written among the points."""
    from bench import lengths
    from pipeline import style

    data = json.loads((ROOT / "reports" / "lengths" / "lengths.json").read_text())
    drawn = []
    monkeypatch.setattr(style, "save", lambda fig, path, **kw: drawn.append(fig))
    lengths.figure(data, ROOT / "unused.png")
    delta = drawn[0].axes[0]
    assert not delta.texts
    labels = [t.get_text() for t in delta.get_legend().get_texts()]
    for s in data["summary"][:1]:
        for m in (m for m in s["methods"] if m != "ddp"):
            ns = [str(x["methods"][m]["diff_top1"]["n"]) for x in data["summary"]]
            assert f"{m} (n = {'/'.join(ns)})" in labels
