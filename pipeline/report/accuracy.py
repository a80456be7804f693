"""The report's Accuracy section: the matrix's top-1 table, each run's Δ against ddp over
the seed study made with the runs' own values, and the notes under it (notes.accuracy_notes,
its seed paragraph from that study)."""

from __future__ import annotations

from typing import Any

from pipeline.report import tables
from pipeline.report.markdown import DASH, fmt, paragraphs, pm, table
from pipeline.report.notes import accuracy_notes


def accuracy_section(
    acc: list[dict[str, Any]],
    missing: list[str],
    study: dict[str, Any] | None,
    studies: list[dict[str, Any]] = (),
) -> list[str]:
    head = [
        "run",
        "method",
        "nodes × ranks",
        "batch",
        "global batch",
        "steps",
        "best top-1 (%)",
        "final top-1 (%)",
        "Δ best vs ddp",
        "Δ best vs ddp over seeds",
        "Δ final vs ddp",
        "lowest val loss",
    ]
    rows = [
        [
            r["run"],
            r["method"],
            f"{r['nodes']} × {r['ranks_per_node']}",
            r["batch"],
            r["global_batch"],
            r["steps"],
            f"{r['best_top1']:.2f}",
            f"{r['final_top1']:.2f}",
            fmt(r["diff_best"], "+.2f"),
            over_seeds(r["run"], studies),
            fmt(r["diff_final"], "+.2f"),
            f"{r['min_val_loss']:.3f}",
        ]
        for r in acc
    ]
    rows += [[name, *[DASH] * (len(head) - 1)] for name in missing]
    md = ["## Accuracy", "", *table(head, rows)]
    return md + ["", *paragraphs(accuracy_paragraphs(acc, study))]


def over_seeds(run: str, studies: list[dict[str, Any]]) -> str:
    """`run`'s Δ best top-1 against ddp as mean ± sd over the seed study made with the runs'
    own values that pairs it with ddp, or — where there is none."""
    for s in studies:
        d = tables.study_difference(s) if s["matches"] else None
        if d and d["compared"] == run:
            return f"{pm(d)} ({d['n']} seeds)"
    return DASH


ONE_SEED = "Every run here is one seed."  # how notes.accuracy_notes' seed paragraph starts


def accuracy_paragraphs(acc: list[dict[str, Any]], study: dict[str, Any] | None) -> list[str]:
    """notes.accuracy_notes, its seed paragraph from the seed study made with the runs' own
    values (matching_study): a study of another configuration says nothing of their noise."""
    out = accuracy_notes(acc, None)
    return [seed_note(study) if n.startswith(ONE_SEED) and study else n for n in out]


def seed_note(study: dict[str, Any]) -> str:
    d = study["diff"]
    return (
        f"{ONE_SEED} Across seeds with the same values (`reports/{study['folder']}/`, "
        f"`python -m bench.seeds`: {d['baseline']} and {d['compared']} at seeds "
        f"{', '.join(d['per_seed'])}), one method's best top-1 moves by up to "
        f"{d['noise']:.2f} points and {d['of']} is {pm(d)} (mean ± sd): a Δ smaller than "
        "that is within seed noise; its sign is what the seed study supports, not its size."
    )
