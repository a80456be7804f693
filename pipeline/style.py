"""One look for every figure: each method's colour and marker, and figure files that are
the same bytes every time they are drawn from the same data.

Imported by the report (pipeline.report.figures), the DVC plots' template (its colour and
shape scales must equal `vega_scales()`; tests/pipeline/test_report_figures.py checks) and
the benchmarks' figures (bench.rates, bench.network, bench.table2); pipeline imports
nothing from bench, so the palette lives here. Matplotlib only where a figure is drawn.

METHODS is also the drawing order: a later method is drawn over an earlier one, so the
smaller marker of ab_powersgd sits on powersgd's larger triangle instead of under it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from abtrain.files import atomic_write_bytes

METHODS = (
    "ddp",
    "ab",
    "ab_nogroups",
    "ab_individual",
    "powersgd",
    "ab_powersgd",
    "localsgd",
    "diloco",
)
# Vega-Lite's default scheme (tableau10), as the report's figures had it; ab_individual
# takes purple rather than the scheme's yellow, which is hard to see on white
COLOURS = {
    "ddp": "#72b7b2",
    "ab": "#4c78a8",
    "ab_nogroups": "#f58518",
    "ab_individual": "#b279a2",
    "powersgd": "#54a24b",
    "ab_powersgd": "#e45756",
    "localsgd": "#9d755d",
    "diloco": "#ff9da7",
}
MARKERS = {  # matplotlib's marker codes
    "ddp": "o",
    "ab": "s",
    "ab_nogroups": "D",
    "ab_individual": "v",
    "powersgd": "^",
    "ab_powersgd": "P",
    "localsgd": ">",
    "diloco": "<",
}
SIZES = {  # marker size in points: powersgd's triangle shows around ab_powersgd's cross
    "ddp": 7.0,
    "ab": 6.5,
    "ab_nogroups": 6.0,
    "ab_individual": 6.5,
    "powersgd": 8.5,
    "ab_powersgd": 6.5,
    "localsgd": 7.0,
    "diloco": 7.0,
}
VEGA_SHAPES = {  # the same shapes in Vega's names
    "o": "circle",
    "s": "square",
    "D": "diamond",
    "v": "triangle-down",
    "^": "triangle-up",
    "P": "cross",
    ">": "triangle-right",
    "<": "triangle-left",
}
OTHER = dict(color="#7f7f7f", marker="*", ms=8.0)  # a method this palette does not know
SALT = "abtrain"  # matplotlib's SVG ids: fixed, not random per process


def rank(method: str) -> int:
    """The method's place in METHODS (its drawing order); unknown methods last."""
    return METHODS.index(method) if method in METHODS else len(METHODS)


def ordered(methods: Iterable[str]) -> list[str]:
    """These methods in drawing order, each once."""
    return sorted(set(methods), key=lambda m: (rank(m), m))


def colour(method: str) -> str:
    return COLOURS.get(method, OTHER["color"])


def size(method: str) -> float:
    return SIZES.get(method, OTHER["ms"])


def marker(method: str, edge: str = "black", filled: bool = True) -> dict[str, Any]:
    """Matplotlib keywords of the method's points: colour, marker, size, a thin edge, and a
    zorder from the drawing order. Not `filled`: an open marker with a thick edge in the
    method's colour, for points that may sit on one another (each outline stays seen)."""
    kw = dict(
        color=colour(method),
        marker=MARKERS.get(method, OTHER["marker"]),
        ms=size(method),
        mec=edge,
        mew=0.5,
        zorder=2 + 0.1 * rank(method),
    )
    if not filled:
        kw.update(mfc="none", mec=kw["color"], mew=1.6, ms=1.1 * kw["ms"])
    return kw


def offsets(methods: Iterable[str], step: float) -> dict[str, float]:
    """A small sideways shift per method, centred on 0 (in drawing order, `step` apart),
    so that equal values at the same x stay visible side by side."""
    ms = ordered(methods)
    return {m: (i - (len(ms) - 1) / 2) * step for i, m in enumerate(ms)}


def handles(
    methods: Iterable[str], line: bool = True, edge: str = "black", filled: bool = True
) -> list[Any]:
    """Legend entries of these methods: colour and marker as `marker` draws them (and a
    line, unless not `line`)."""
    from matplotlib.lines import Line2D

    out = []
    for m in ordered(methods):
        kw = marker(m, edge, filled)
        kw.pop("zorder")
        out.append(Line2D([], [], ls="-" if line else "", label=m, **kw))
    return out


def vega_scales(methods: Iterable[str] = METHODS) -> dict[str, dict[str, list[str]]]:
    """The Vega-Lite scales of the `method` field: colour and point shape of `methods`, in
    the palette's order. A Vega-Lite legend lists its scale's whole domain: the curves'
    templates take the methods the profiles' matrices run (`plotted_methods`), so the
    legend names no method without a run."""
    ms = ordered(methods)
    return dict(
        color=dict(domain=ms, range=[COLOURS[m] for m in ms]),
        shape=dict(domain=ms, range=[VEGA_SHAPES[MARKERS[m]] for m in ms]),
    )


def plotted_methods(*params: dict[str, Any]) -> list[str]:
    """The methods the matrices of these params run (the default profile's and the paper's
    share the curves' templates), in the palette's order."""
    from pipeline.matrix import runs

    return ordered({r.method for p in params for r in runs(p).values()})


@contextmanager
def matplotlib_defaults() -> Iterator[Any]:
    """pyplot with matplotlib's own defaults, whatever a matplotlibrc (or MATPLOTLIBRC)
    says, and a fixed salt for SVG ids: a figure drawn in here is the same on every
    machine with the pinned matplotlib (its font, DejaVu Sans, comes with it). Yields
    pyplot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with plt.style.context("default"), matplotlib.rc_context({"svg.hashsalt": SALT}):
        yield plt


# what matplotlib writes into a file besides the picture: its version and the time
METADATA = {
    "png": {"Software": None},
    "svg": {"Creator": None, "Date": None},
    "pdf": {"Creator": None, "Producer": None, "CreationDate": None},
}


def save(fig: Any, path: str | Path, dpi: float) -> Path:
    """Write the figure (PNG, SVG or PDF by its suffix) with no version or date in it: the
    same figure is the same bytes. A file that already holds them is left alone; another
    is replaced whole (write_bytes). Closes the figure."""
    import io

    import matplotlib
    import matplotlib.pyplot as plt

    path = Path(path)
    kind = path.suffix.lstrip(".").lower()
    buf = io.BytesIO()
    try:
        with matplotlib.rc_context({"svg.hashsalt": SALT}):
            fig.savefig(buf, format=kind, dpi=dpi, metadata=METADATA.get(kind))
    finally:
        plt.close(fig)
    write_bytes(path, buf.getvalue())
    return path


def write_bytes(path: str | Path, data: bytes) -> None:
    """Replace the file only where its bytes change (atomically, see abtrain.files)."""
    path = Path(path)
    if path.exists() and path.read_bytes() == data:
        return
    atomic_write_bytes(path, data)


def strip_png_text(path: str | Path) -> None:
    """Drop the text and time chunks (tEXt, zTXt, iTXt, tIME) of a PNG written elsewhere,
    e.g. matplotlib's `Software: Matplotlib version...`; the picture is untouched."""
    import struct

    path = Path(path)
    data = path.read_bytes()
    out, i = [data[:8]], 8
    while i < len(data):
        (n,) = struct.unpack(">I", data[i : i + 4])
        if data[i + 4 : i + 8] not in (b"tEXt", b"zTXt", b"iTXt", b"tIME"):
            out.append(data[i : i + 12 + n])
        i += 12 + n
    write_bytes(path, b"".join(out))
