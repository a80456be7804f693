"""The report and its plots from a matrix of synthetic results: what they say, not only that
they exist. The figures' content is checked in the rendered SVG and in the spec that
`dvc plots show` itself writes."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from abtrain.config import AB_METHODS
from tests.conftest import ROOT

# every test reads what the report stage (`python -m pipeline.report`) wrote; one runs dvc
pytestmark = pytest.mark.pipeline

BIN = Path(sys.executable).parent
CHARTS = ("val_top1_vs_step", "val_top1_vs_inter_node_mb")


def result(name: str, run: dict, reference: int, batch_size: int) -> dict:
    """A run's results/NAME.json as pipeline.train writes it; ab sends 40% of ddp's bytes."""
    world = run["nodes"] * run["ranks_per_node"]
    global_batch = batch_size * world if run["batch"] == "local" else reference
    share = {"ddp": 1.0, "ab": 0.4, "ab_nogroups": 0.7, "powersgd": 0.1, "ab_powersgd": 0.09}[
        run["method"]
    ]
    steps, per_step = 100, 8e6 * share
    top1 = {"ddp": 33.0, "ab": 30.5, "ab_nogroups": 31.0, "powersgd": 32.0, "ab_powersgd": 30.0}[
        run["method"]
    ]
    evals = [
        dict(step=s, val_top1=top1 - (100 - s) / 10, val_loss=2.0 - s / 1000,
             inter_node_bytes=per_step * s, samples=s * global_batch, epoch=s / 50)
        for s in (25, 50, 75, 100)
    ]  # fmt: skip
    ranks = {"blocks.0.fc1": 64, "blocks.0.fc2": 64}
    low = run["method"] in AB_METHODS  # factorised: compression, phases
    by_phase = {"full": per_step * steps} if not low else {
        "warmup": per_step * steps * 0.8, "sync": per_step * steps * 0.2, "ab": 0.0
    }  # fmt: skip
    return dict(
        method=run["method"],
        world_size=world,
        nodes=run["nodes"],
        steps=steps,
        val_top1=dict(best=top1, final=top1 - (0.3 if low else 0.0)),
        val_loss=dict(min=1.9, final=1.9),
        compression_ratio=0.75 if low else 1.0,
        ranks=ranks if low else {},
        factorizations=[dict(step=10, compression_ratio=0.75, ranks=ranks)] * 2 if low else [],
        traffic=dict(
            inter_node_bytes=per_step * steps,
            total_bytes=2 * per_step * steps,
            by_phase={k: dict(inter=v, intra=v, total=2 * v) for k, v in by_phase.items()},
        ),
        wall_seconds=60.0 / share,
        evals=evals,
        run=dict(name=name, nodes=run["nodes"], ranks_per_node=run["ranks_per_node"],
                 batch=run["batch"], global_batch=global_batch, model="vit", data="cifar10"),
    )  # fmt: skip


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    """A working copy with results/ and plots/ for the default matrix, and the report run."""
    repo = tmp_path_factory.mktemp("report")
    for f in ("params.yaml", "dvc.yaml", "pipeline/curves_template.json",
              "pipeline/paper_reference.json", "reports/seeds/seeds.json",
              "reports/seeds-best-abps/seeds.json", "reports/seeds-best-ab/seeds.json",
              "results/search/propulate/best.json"):  # fmt: skip
        (repo / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, repo / f)
    p = yaml.safe_load((repo / "params.yaml").read_text())
    matrix = p["experiments"]["runs"]
    (repo / "results").mkdir(exist_ok=True)  # holds the search's record already
    (repo / "plots").mkdir()
    for name, run in matrix.items():
        r = result(name, run, p["experiments"]["reference_global_batch"], p["train"]["batch_size"])
        (repo / "results" / f"{name}.json").write_text(json.dumps(r))
        rows = [
            dict(run=name, step=e["step"], val_top1=e["val_top1"], val_loss=e["val_loss"],
                 inter_node_mb=e["inter_node_bytes"] / 1e6, samples=e["samples"])
            for e in r["evals"]
        ]  # fmt: skip
        (repo / "plots" / f"{name}.json").write_text(json.dumps(rows))
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline.report"], cwd=repo, env=env, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return repo, list(matrix), env


def test_the_report_gives_absolute_top1_and_explains_its_odd_values(reported):
    repo, names, _ = reported
    md = (repo / "reports" / "README.md").read_text()
    for name in names:
        row = next(line for line in md.splitlines() if line.startswith(f"| {name} |"))
        best = {"ddp": "33.00 | 33.00", "ab": "30.50 | 30.20", "abng": "31.00 | 30.70"}
        best.update(psgd="32.00 | 32.00", abps="30.00 | 29.70")
        assert f"| {best[name.split('-')[0]]} |" in row, row
    assert "| ab-2x2 | ab | 2 × 2 | local | 128 | 100 | 30.50 | 30.20 | -2.50 | -2.80 |" in md
    assert "**Compression below 1:1** (0.75:1)" in md and "r(m+n)" in md
    assert "**Negative ECR** (-25.0% for 0.75:1)" in md and "133%" in md
    assert "up to 1.60 points" in md  # the seed study, where its numbers are
    # and each pair studied over seeds from the committed search record, with its
    # differences as that study wrote them; a study of an earlier record is named apart
    study = json.loads((repo / "reports/seeds-best-ab/seeds.json").read_text())
    diffs = ", ".join(f"{v:+.2f}" for v in study["summary"]["difference"]["per_seed"].values())
    line = next(x for x in md.splitlines() if x.startswith("- [`seeds-best-ab/`]"))
    assert "with the search's values: ab-2x2 - ddp-2x2 over seeds 0, 1, 2" in line
    assert f"is {diffs} points" in line
    apart = next(x for x in md.splitlines() if x.startswith("- Trained from an earlier"))
    assert "seeds-best-abps/" in apart and "seeds-best-abps/" not in line
    # every figure has its caption right under it, and every figure it names exists
    lines = md.splitlines()
    shown = [i for i, line in enumerate(lines) if line.startswith("![")]
    assert len(shown) >= 4
    for i in shown:
        assert lines[i + 2].startswith("*") and len(lines[i + 2]) > 80, lines[i]
        path = re.search(r"\]\((.*?)\)", lines[i]).group(1)
        assert (repo / "reports" / path).stat().st_size > 5000
    assert "accuracy_loss_compression_vs_batch" not in md and "plots_template" not in md


def test_metrics_hold_each_runs_bytes_per_step_against_its_ddp_run(reported):
    repo, names, _ = reported
    folder = repo / "reports" / "metrics"
    metrics = {f.stem: json.loads(f.read_text()) for f in folder.glob("*.json")}
    assert sorted(metrics) == sorted(names)
    for name, m in metrics.items():
        assert list(m) == ["vs_ddp"]
        want = {"ddp": 1.0, "ab": 0.4, "abng": 0.7, "psgd": 0.1, "abps": 0.09}[name.split("-")[0]]
        assert m["vs_ddp"] == pytest.approx(want)


def test_the_rendered_curves_show_every_run(reported):
    repo, names, _ = reported
    rows = json.loads((repo / "reports" / "curves.json").read_text())
    assert {r["run"] for r in rows} == set(names)
    assert len({r["scale"] for r in rows}) == 3  # 2x2 local, 2x1 local, 2x1 global
    for chart in CHARTS:
        svg = (repo / "reports" / "figures" / f"{chart}.svg").read_text()
        for name in names:  # each line is labelled with its run's name
            assert f">{name}<" in svg, (chart, name)
        assert "2 nodes × 1 rank, global batch" in svg  # a panel per scale
        assert (repo / "reports" / "figures" / f"{chart}.png").stat().st_size > 20_000
        page = (repo / "reports" / "plots" / f"{chart}.html").read_text()
        assert "cdn.jsdelivr" not in page and "vegaEmbed" in page  # offline: scripts inlined
    assert (
        "inter-node MB sent per rank so far"
        in (repo / "reports" / "figures" / "val_top1_vs_inter_node_mb.svg").read_text()
    )


def test_dvc_plots_show_draws_the_same_spec_with_every_run(reported):
    repo, names, env = reported
    for cmd in (["git", "init", "-q"], [str(BIN / "dvc"), "init", "-q"]):
        subprocess.run(cmd, cwd=repo, env=env, check=True, capture_output=True)
    proc = subprocess.run(
        [str(BIN / "dvc"), "plots", "show", "--json"], cwd=repo, env=env, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    assert not shown.get("errors"), shown.get("errors")
    sys.path.insert(0, str(ROOT))
    from pipeline import plots

    os.chdir(repo)  # plots reads dvc.yaml and the template from the working copy
    try:
        defs = plots.definitions()
        rows = json.loads((repo / "reports" / "curves.json").read_text())
        for chart in CHARTS:
            (entry,) = shown["data"][chart]
            spec = entry["content"]
            values = spec["data"]["values"]
            for name in names:
                assert sum(v["run"] == name for v in values) == 4, (chart, name)
            ours = plots.spec(defs[chart], rows)
            drop = {"filename", "field"}  # DVC's own bookkeeping
            spec["data"]["values"] = [{k: v for k, v in r.items() if k not in drop} for r in values]
            assert spec == ours
    finally:
        os.chdir(ROOT)
