"""The report and its plots from a matrix of synthetic results: what they say, not only that
they exist. The figures' content is checked in the rendered SVG and in the spec that
`dvc plots show` itself writes."""

import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest
import yaml

from abtrain.config import AB_METHODS, Method
from pipeline import style
from tests.helpers import ROOT

# every test reads what the report stage (`python -m pipeline.report`) wrote; one runs dvc
pytestmark = pytest.mark.pipeline

BIN = Path(sys.executable).parent
CHARTS = ("val_top1_vs_step", "val_top1_vs_inter_node_mb")


def result(name: str, run: dict, reference: int, batch_size: int) -> dict:
    """A run's results/NAME.json as pipeline.train writes it; ab sends 40% of ddp's bytes."""
    world = run["nodes"] * run["ranks_per_node"]
    global_batch = batch_size * world if run["batch"] == "local" else reference
    share = {
        "ddp": 1.0, "ab": 0.4, "ab_nogroups": 0.7, "powersgd": 0.1, "ab_powersgd": 0.09,
        "localsgd": 0.25, "diloco": 0.25,
    }[run["method"]]  # fmt: skip
    steps, per_step = 100, 8e6 * share
    top1 = {
        "ddp": 33.0, "ab": 30.5, "ab_nogroups": 31.0, "powersgd": 32.0, "ab_powersgd": 30.0,
        "localsgd": 32.5, "diloco": 30.7,
    }[run["method"]]  # fmt: skip
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
              "pipeline/curves_template_logx.json", "pipeline/paper_reference.json", "reports/seeds/seeds.json",
              "reports/seeds-best-abps/seeds.json", "reports/seeds-best-ab/seeds.json",
              "results/search/propulate/best.json"):  # fmt: skip
        (repo / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, repo / f)
    p = yaml.safe_load((repo / "params.yaml").read_text())
    matrix = p["experiments"]["runs"]
    # the studies as made with this model, the searched ones from the copied record
    record = json.loads((repo / "results/search/propulate/best.json").read_text())["params"]
    for f in ("seeds", "seeds-best-abps", "seeds-best-ab"):
        d = json.loads((repo / "reports" / f / "seeds.json").read_text())
        d["model"] = p["train"]["model"]
        if d["search_best_values"]:
            d["search_best"] = record
        (repo / "reports" / f / "seeds.json").write_text(json.dumps(d))
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
        best.update(localsgd="32.50 | 32.50", diloco="30.70 | 30.70")
        assert f"| {best[name.split('-')[0]]} |" in row, row
    # Δ over seeds: the committed study made with the record's values (copied in above)
    d = json.loads((repo / "reports/seeds-best-ab/seeds.json").read_text())
    spread = d["summary"]["difference"]["spread"]
    seeds = f"{spread['mean']:+.2f} ± {spread['std']:.2f} ({spread['n']} seeds)"
    assert (
        f"| ab-2x2 | ab | 2 × 2 | local | 128 | 100 | 30.50 | 30.20 | -2.50 | {seeds} | -2.80 |"
        in md
    )
    assert (
        "| abng-2x2 | ab_nogroups | 2 × 2 | local | 128 | 100 | 31.00 | 30.70 | -2.00 | — |" in md
    )
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
    abps = next(x for x in md.splitlines() if x.startswith("- [`seeds-best-abps/`]"))
    assert "with the search's values: abps-2x2 - ddp-2x2" in abps  # also the record's
    assert "Trained from an earlier" not in md  # no study of another record copied in
    # every figure has its caption right under it, and every figure it names exists
    lines = md.splitlines()
    shown = [i for i, line in enumerate(lines) if line.startswith("![")]
    assert len(shown) >= 4
    for i in shown:
        assert lines[i + 2].startswith("*") and len(lines[i + 2]) > 80, lines[i]
        path = re.search(r"\]\((.*?)\)", lines[i]).group(1)
        assert (repo / "reports" / path).stat().st_size > 5000
    assert "accuracy_loss_compression_vs_batch" not in md and "plots_template" not in md


def test_metrics_hold_each_runs_figures_and_its_ratio_to_its_ddp_run(reported):
    """One metrics file per run holding all its figures: `dvc metrics show` gives one row
    per run, the run's own numbers beside its ratio and difference to ddp."""
    repo, names, _ = reported
    folder = repo / "reports" / "metrics"
    metrics = {f.stem: json.loads(f.read_text()) for f in folder.glob("*.json")}
    assert sorted(metrics) == sorted(names)
    ddp = {n: m for n, m in metrics.items() if n.startswith("ddp")}
    for name, m in metrics.items():
        assert set(m) == {
            "top1_best",
            "top1_final",
            "inter_node_mb_per_step",
            "compression",
            "wall_minutes",
            "vs_ddp",
            "top1_best_vs_ddp",
        }
        want = {"ddp": 1.0, "ab": 0.4, "abng": 0.7, "psgd": 0.1, "abps": 0.09, "localsgd": 0.25}
        want = {**want, "diloco": 0.25}[name.split("-")[0]]
        assert m["vs_ddp"] == pytest.approx(want)
        scale = name.removeprefix("localsgd-ab-") if "-ab-" in name else name.split("-", 1)[1]
        base = ddp["ddp-" + scale]
        assert m["top1_best_vs_ddp"] == pytest.approx(m["top1_best"] - base["top1_best"])


def test_the_rendered_curves_show_every_run(reported):
    repo, names, _ = reported
    rows = json.loads((repo / "reports" / "curves.json").read_text())
    assert {r["run"] for r in rows} == set(names)
    assert len({r["scale"] for r in rows}) == 3  # 2x2 local, 2x1 local, 2x1 global
    for chart in CHARTS:
        svg = (repo / "reports" / "figures" / f"{chart}.svg").read_text()
        for name in names:  # each line is labelled with its run's name
            assert f">{name}<" in svg, (chart, name)
        assert ">ab_individual<" not in svg  # the legend lists the methods that ran
        assert "2 nodes × 1 rank, global batch" in svg  # a panel per scale
        assert (repo / "reports" / "figures" / f"{chart}.png").stat().st_size > 20_000
        page = (repo / "reports" / "plots" / f"{chart}.html").read_text()
        assert "cdn.jsdelivr" not in page and "vegaEmbed" in page  # offline: scripts inlined
    assert (
        "inter-node MB sent per rank so far"
        in (repo / "reports" / "figures" / "val_top1_vs_inter_node_mb.svg").read_text()
    )
    # each method in its colour of pipeline.style, as in the matplotlib figures
    methods = {r["method"] for r in rows}
    for chart in CHARTS:
        svg = (repo / "reports" / "figures" / f"{chart}.svg").read_text()
        for m in methods:
            assert f'stroke="{style.COLOURS[m]}"' in svg, (chart, m)


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
            # the same, but for the legend: ours lists only the methods that have a run
            assert plots.only_present(spec, {r["method"] for r in rows}) == ours
    finally:
        os.chdir(ROOT)


def test_every_method_has_one_colour_and_one_marker_in_every_figure():
    """One palette (pipeline.style) for the report, the DVC plots and the benchmarks: every
    method a colour and a marker of its own, and the template's scales are the palette's."""
    assert set(style.METHODS) == set(get_args(Method))
    assert len(set(style.COLOURS.values())) == len(style.METHODS)
    assert len(set(style.MARKERS.values())) == len(style.METHODS)
    # the templates' legends: the methods the profiles' matrices run, none without a run
    profiles = [
        yaml.safe_load((ROOT / f).read_text()) for f in ("params.yaml", "profiles/paper.yaml")
    ]
    plotted = style.plotted_methods(*profiles)
    assert "ab_individual" not in plotted and {"ddp", "ab", "localsgd", "diloco"} <= set(plotted)
    scales = style.vega_scales(plotted)
    for name in ("curves_template.json", "curves_template_logx.json"):
        template = json.loads((ROOT / "pipeline" / name).read_text())
        assert template["spec"]["encoding"]["color"]["scale"] == scales["color"]
        layers = template["spec"]["layer"]
        (line,) = [x for x in layers if x.get("mark", {}).get("type") == "line"]
        assert line["encoding"]["shape"]["field"] == "method"
        assert line["encoding"]["shape"]["scale"] == scales["shape"]
    # a later method is drawn over an earlier one; ab_powersgd over powersgd's larger marker
    assert style.rank("ab_powersgd") > style.rank("powersgd")
    assert style.size("ab_powersgd") < style.size("powersgd")
    assert style.marker("ab_powersgd")["zorder"] > style.marker("powersgd")["zorder"]
    spread = style.offsets(["powersgd", "ab_powersgd", "ddp"], 0.05)
    assert sorted(spread.values()) == pytest.approx([-0.05, 0.0, 0.05])


def test_the_log_x_template_is_the_template_with_a_log_x_axis(tmp_path):
    """One template to edit: the committed log-x one is what `python -m pipeline.plots
    --template` writes from curves_template.json, its x scale alone changed."""
    from pipeline import plots

    made = plots.log_x_template(ROOT / plots.TEMPLATE, tmp_path / "logx.json")
    assert made.read_bytes() == (ROOT / plots.LOG_X_TEMPLATE).read_bytes()
    base, logx = (json.loads((ROOT / f).read_text()) for f in plots.TEMPLATES)
    assert logx["spec"]["encoding"]["x"].pop("scale") == {"type": "log"}
    assert logx == base


def png_text_chunks(path: Path) -> list[bytes]:
    data, i, found = path.read_bytes(), 8, []
    while i < len(data):
        (n,) = struct.unpack(">I", data[i : i + 4])
        if data[i + 4 : i + 8] in (b"tEXt", b"zTXt", b"iTXt", b"tIME"):
            found.append(data[i + 8 : i + 8 + n])
        i += 12 + n
    return found


def digests(folder: Path) -> dict[str, str]:
    """sha256 of every file under `folder`; reports/README.md without its line `Generated
    ... on <time>`."""
    out = {}
    for f in sorted(folder.rglob("*")):
        if f.is_file():
            data = f.read_bytes()
            if f.name == "README.md" and f.parent == folder:
                data = b"\n".join(x for x in data.split(b"\n") if not x.startswith(b"Generated "))
            out[str(f.relative_to(folder))] = hashlib.sha256(data).hexdigest()
    return out


def test_the_report_and_pipeline_plots_write_the_same_bytes_every_time(reported):
    """`python -m pipeline.plots` after the report, and the report again, leave every file
    under reports/ as it was, byte for byte (but the time in the README's first line): no
    date, version or random id in a figure, and the two writers of the curves agree."""
    repo, _, env = reported
    before = digests(repo / "reports")
    assert any(k.endswith(".png") for k in before) and any(k.endswith(".svg") for k in before)
    for module in ("pipeline.plots", "pipeline.report"):
        proc = subprocess.run(
            [sys.executable, "-m", module], cwd=repo, env=env, capture_output=True, text=True,
            timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert digests(repo / "reports") == before, module
    for png in (repo / "reports" / "figures").glob("*.png"):
        assert png_text_chunks(png) == [], png.name  # no "Software: Matplotlib version..."
    assert not list((repo / "reports").rglob("*.tmp*"))  # no temporary file left among them


def test_figures_saved_through_the_style_are_the_same_bytes_each_time(tmp_path):
    """PNG without matplotlib's version, SVG without its date and with fixed ids: the same
    figure drawn twice is the same file, and a matplotlibrc does not change it."""
    import matplotlib

    def draw(name: str) -> None:
        with style.matplotlib_defaults() as plt:
            fig, ax = plt.subplots(figsize=(3, 2))
            ax.plot([1, 2, 3], [3, 1, 2], **style.marker("ab_powersgd"))
            ax.legend(handles=style.handles(["ab_powersgd", "ddp"]))
            if name == "plain.png":
                fig.savefig(tmp_path / name)  # what plain savefig writes
                plt.close(fig)
            else:
                style.save(fig, tmp_path / name, dpi=80)

    for name in ("a.png", "b.png", "a.svg", "b.svg", "plain.png"):
        draw(name)
    with matplotlib.rc_context({"lines.linewidth": 9, "axes.facecolor": "black"}):
        draw("rc.png")  # a matplotlibrc's settings stay outside the figures
    png = (tmp_path / "a.png").read_bytes()
    assert png == (tmp_path / "b.png").read_bytes() == (tmp_path / "rc.png").read_bytes()
    assert png_text_chunks(tmp_path / "a.png") == []
    svg = (tmp_path / "a.svg").read_text()
    assert svg == (tmp_path / "b.svg").read_text()
    assert "<dc:date>" not in svg and "Matplotlib v" not in svg
    # a PNG written elsewhere (search.compare's) loses its text chunks, not its picture
    assert png_text_chunks(tmp_path / "plain.png")
    style.strip_png_text(tmp_path / "plain.png")
    assert png_text_chunks(tmp_path / "plain.png") == []
    from PIL import Image

    assert Image.open(tmp_path / "plain.png").size == (300, 200)


def test_run_names_sit_right_of_their_lines_and_apart():
    """The curves' labels: one per run, at its last point's top-1 unless a name below it is
    too close, never two within the gap of each other in a panel."""
    from pipeline.report.tables import with_label_positions

    rows = [
        dict(run=run, scale=scale, step=step, val_top1=top1)
        for run, scale, ends in (
            ("ddp", "2x2", 33.70),
            ("ab", "2x2", 33.65),
            ("psgd", "2x2", 33.60),
            ("ddp-1", "2x1", 25.0),
        )
        for step, top1 in ((1, 24.0), (2, ends))
    ]
    out = with_label_positions(rows, gap=0.05)
    labels = {r["run"]: r["label_y"] for r in out if r["label_y"] is not None}
    assert set(labels) == {"ddp", "ab", "psgd", "ddp-1"}
    assert [r["label_y"] for r in out if r["step"] == 1] == [None] * 4
    assert labels["ddp-1"] == 25.0  # alone in its panel: where its line ends
    gap = 0.05 * (33.70 - 24.0)
    ys = sorted(labels[r] for r in ("ddp", "ab", "psgd"))
    assert all(b - a >= gap - 1e-9 for a, b in zip(ys, ys[1:]))
    assert max(ys) <= 33.70 + 1e-9  # no higher than the charts' top


def test_a_stack_of_names_is_centred_on_the_ends_it_labels():
    """Three ends close together mid-chart: the names spread both ways from their mean, so
    none is further from its line than the stack needs (pushing up only put the top name
    two gaps above its line)."""
    from pipeline.report.tables import spread_apart

    ys = spread_apart([30.0, 30.1, 30.2], 0.5)
    assert ys == pytest.approx([29.6, 30.1, 30.6])
    assert max(abs(y - w) for y, w in zip(ys, [30.0, 30.1, 30.2])) <= 0.4 + 1e-9
    assert spread_apart([20.0, 30.0], 0.5) == [20.0, 30.0]  # apart already: where they end
    merged = spread_apart([29.0, 30.0, 30.1], 0.6)  # a stack that then overlaps its neighbour
    assert all(b - a >= 0.6 - 1e-9 for a, b in zip(merged, merged[1:]))


def test_the_dotted_one_to_one_line_is_drawn_over_the_compression_lines(tmp_path, monkeypatch):
    """The caption names the dotted 1:1 line; DDP's thick nested line lies on it: the
    committed runs drawn, the 1:1 line is above every method's line in each panel."""
    from pipeline.report import figures

    p = yaml.safe_load((ROOT / "params.yaml").read_text())
    done = {
        name: json.loads((ROOT / "results" / f"{name}.json").read_text())
        for name in p["experiments"]["runs"]
        if (ROOT / "results" / f"{name}.json").exists()
    }
    drawn = {}
    monkeypatch.setattr(figures, "FIGURES", tmp_path)
    monkeypatch.setattr(style, "save", lambda fig, path, **kw: drawn.setdefault(path.name, fig))
    figures.figures(done, p)
    fig = drawn["accuracy_compression_vs_ranks.png"]
    compression = [ax for ax in fig.axes if "compression" in ax.get_ylabel()]
    assert len(compression) == 2
    for ax in compression:
        ones = [ln for ln in ax.lines if ln.get_linestyle() == ":" and set(ln.get_ydata()) == {1}]
        methods = [ln for ln in ax.lines if ln.get_label() in style.METHODS]
        assert len(ones) == 1 and methods
        assert ones[0].get_zorder() > max(ln.get_zorder() for ln in methods)
