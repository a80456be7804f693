"""The README's opening: reports/headline.md, written by the report stage, and its copy
into the README between its markers (`python -m pipeline.report --readme`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from abtrain.files import atomic_write_text
from pipeline.report import tables
from pipeline.report.markdown import fmt, table
from pipeline.report.tables import REPORTS
from pipeline.report.verdict import verdict

HEADLINE = REPORTS / "headline.md"


def headline(
    p: dict[str, Any], acc: list[dict], t1: list[dict], paper: dict[str, Any] | None = None
) -> str:
    """reports/headline.md: the README's opening, copied there between its markers (a test
    keeps the two equal), so the README's figures are the report's. The verdict first (the
    report's own, verdict.verdict, without this machine's GB/s, so that it reproduces), then
    every run of the matrix. `paper`: pipeline/paper_reference.json, read if not given."""
    paper = paper if paper is not None else tables.paper_reference()
    traffic = {r["run"]: r for r in t1}
    top = verdict(p, acc, t1, paper, tables.seed_studies(p))
    head = [
        "run",
        "method",
        "nodes × ranks",
        "batch per rank",
        "best top-1",
        "inter-node MB/step/rank",
        "bytes vs ddp",
    ]
    rows = []
    for r in acc:
        t = traffic[r["run"]]
        rows.append(
            [
                r["run"],
                r["method"],
                f"{r['nodes']} × {r['ranks_per_node']}",
                r["global_batch"] // (r["nodes"] * r["ranks_per_node"]),
                f"{r['best_top1']:.2f}%",
                f"{t['inter_bytes_per_step'] / 1e6:.2f}",
                fmt(t["ratio_to_ddp"], ".3f"),
            ]
        )
    lines = [
        "Every run of the matrix, one seed each (the report, `reports/README.md`, has the rest):",
        "",
        *table(head, rows),
    ]
    text = []
    d = tables.reruns()
    if d is not None:
        gap, ratio = d["spread"]["top1 gap (points)"], d["spread"]["bytes ratio"]
        lr = [r["params"].get("optim.lr") for r in d["rows"] if "optim.lr" in r["params"]]
        text.append(
            f"What a rerun of the search may move: {gap['n']} Propulate searches with the "
            f"same settings (`reports/search-reruns/`"
            + ("" if tables.same_model(d, p) else f", made with {tables.EARLIER_MODEL}")
            + ") chose "
            + (f"{learning_rates(lr)}\nand " if lr else "")
            + f"gave an {d['runs'][1]} − {d['runs'][0]} gap of {gap['min']:+.2f} to "
            f"{gap['max']:+.2f} points (sd {gap['std']:.2f}) and a bytes ratio of "
            f"{ratio['min']:.3f} to {ratio['max']:.3f}.\nThe runs train from the committed "
            f"record of one search (`results/search/{p['search']['backend']}/`), so a fresh "
            "clone's `dvc repro` gives back every byte count and compression exactly,\nand "
            "every top-1 exactly on a machine like the one that made them (elsewhere within "
            "the tolerance `python -m pipeline.reproduce` states, docs/reproduce.md);\n"
            f"`dvc repro --force --downstream search@{p['search']['backend']}` reruns it."
        )  # a line a clause: the README's source is read as it is shown
    glance = REPORTS / "figures" / "verdict.png"  # figures.verdict_figure, drawn before this
    if top and glance.exists():
        top = [*top, "", f"![the verdict at a glance]({glance.as_posix()})"]
    out = [*top, "", *lines] if top else lines
    return "\n".join(out) + "\n" + ("\n" + " ".join(text) + "\n" if text else "")


def learning_rates(lr: list[float]) -> str:
    """The searches' learning rates as a range, or the one they all chose."""
    lo, hi = f"{min(lr):.3g}", f"{max(lr):.3g}"
    return f"the same learning rate ({lo})" if lo == hi else f"learning rates from {lo} to {hi}"


MARKS = ("<!-- headline: begin -->\n", "<!-- headline: end -->")


def copy_headline(readme: Path = Path("README.md")) -> None:
    """`python -m pipeline.report --readme`: reports/headline.md into the README."""
    text = readme.read_text()
    head, rest = text.split(MARKS[0], 1)
    _, tail = rest.split(MARKS[1], 1)
    atomic_write_text(readme, head + MARKS[0] + HEADLINE.read_text() + MARKS[1] + tail)
