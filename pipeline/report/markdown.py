"""Markdown and number formatting shared by the report and the studies' pages: cells, ranges,
mean ± sd, figures, paragraphs and `table`, the one builder of a Markdown table. Formats
what it is given; reads no file."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

DASH = "—"


def table(header: Sequence[object], rows: Iterable[Sequence[object]]) -> list[str]:
    """A Markdown table as lines: `header`, its rule, then one line per row of `rows`, each
    cell written as given (format it before: `fmt`, `pm`, ...)."""

    def line(cells: Sequence[object]) -> str:
        return "| " + " | ".join(str(c) for c in cells) + " |"

    body = list(rows)
    wrong = [r for r in body if len(r) != len(header)]
    if wrong:  # Markdown would draw it anyway, its cells under the wrong heads
        raise ValueError(f"a row of {len(wrong[0])} cells in a table of {len(header)} columns")
    return [line(header), "|" + "---|" * len(header), *(line(r) for r in body)]


def fmt(x: Any, spec: str = ".2f", unit: str = "") -> str:
    return DASH if x is None else format(x, spec) + unit


def span(values: list[float], spec: str, dash: str = "–") -> str:
    """The lowest and highest of `values`, or the one value where they agree."""
    lo, hi = (format(v, spec) for v in (min(values), max(values)))
    return lo if lo == hi else f"{lo}{dash}{hi}"


def figure(path: str, caption: str) -> list[str]:
    return [f"![{Path(path).stem}]({path})", "", f"*{caption}*", ""]


def paragraphs(texts: list[str]) -> list[str]:
    """Paragraphs under a table, each followed by a blank line."""
    return sum(([n, ""] for n in texts), [])


def pm(d: dict[str, Any]) -> str:
    """A study's difference as mean ± sd (the mean alone from one seed)."""
    return f"{d['mean']:+.2f}" + (f" ± {d['sd']:.2f}" if d.get("sd") is not None else "")


def mean_sd(values: list[float]) -> str:
    """`values` as mean ± sample sd, or the one value (1 run) where there is one."""
    if len(values) == 1:
        return f"{values[0]:.3f} (1 run)"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f} ({len(values)} runs)"
