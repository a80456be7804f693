"""The report's figures (matplotlib), each with its caption, under reports/figures/.

The validation curves are DVC plots, rendered offline by `pipeline.plots` (its own command,
`python -m pipeline.plots`, and dvc.yaml's `plots:`); here they get their captions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from abtrain.files import atomic_write_text
from pipeline.report.tables import REPORTS, per_step

FIGURES = REPORTS / "figures"
TABLEAU10 = ["#4c78a8", "#f58518", "#e45756", "#72b7b2", "#54a24b", "#eeca3b", "#b279a2"]


def in_scheme(s: dict, scheme: str, p: dict) -> bool:
    """Constant-local scaling: runs with the local batch scheme; constant-global scaling:
    runs whose global batch is the reference (the 2x2 local runs belong to both)."""
    if scheme == "local":
        return s["run"]["batch"] == "local"
    return s["run"]["global_batch"] == p["experiments"]["reference_global_batch"]


def figures(done: dict[str, dict], p: dict) -> list[tuple[str, str]]:
    """The matplotlib figures, as (file under reports/, caption)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    methods = sorted({s["method"] for s in done.values()})
    # Vega-Lite's default scheme in its (sorted) order: a method has one colour on the page
    color = dict(zip(methods, TABLEAU10 * (1 + len(methods) // len(TABLEAU10))))
    reference = p["experiments"]["reference_global_batch"]
    FIGURES.mkdir(parents=True, exist_ok=True)

    def save(fig, name, caption):
        fig.tight_layout()
        fig.savefig(FIGURES / name, dpi=100)
        plt.close(fig)
        made.append((f"figures/{name}", caption))

    def points(scheme, method, value):
        return sorted(
            (s["world_size"], value(s))
            for s in done.values()
            if s["method"] == method and in_scheme(s, scheme, p)
        )

    def method_lines(ax, scheme, value):
        """One line per method of `value` against the ranks, in the method's colour."""
        for m in methods:
            pts = points(scheme, m, value)
            if pts:
                ax.plot(*zip(*pts), marker="o", color=color[m], label=m)

    def ranks_axis(ax, scheme):
        worlds = sorted({s["world_size"] for s in done.values() if in_scheme(s, scheme, p)})
        ax.set_xticks(worlds)
        ax.grid(alpha=0.3)

    titles = {
        "local": "constant local batch (global batch grows with ranks)",
        "global": f"constant global batch ({reference} in all)",
    }
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))  # like the paper's Figure 1: traffic
    for ax, scheme in zip(axes, ("local", "global")):
        method_lines(ax, scheme, lambda s: per_step(s) / 1e6)
        ax.set(
            title=titles[scheme],
            xlabel="ranks (world size)",
            ylabel="inter-node MB per step per rank",
        )
        ranks_axis(ax, scheme)
        ax.legend(fontsize=8)
    save(
        fig,
        "traffic_vs_scale.png",
        "Inter-node megabytes each rank sends per training step (mean over ranks, whole run: "
        "warm-up, AB phases, syncs and rebounds), against the number of ranks; left at "
        "constant local batch, right at constant global batch. Lower is less network "
        "traffic; the gap between a method's line and ddp's is its saving. The bytes of a "
        "step do not depend on the batch, so a point shared by both panels has one value.",
    )

    fig, axes = plt.subplots(2, 2, figsize=(10, 7))  # like Figures 3-7, against ranks
    for row, scheme in enumerate(("local", "global")):
        ax = axes[row, 0]
        for m in methods:
            best = points(scheme, m, lambda s: s["val_top1"]["best"])
            final = points(scheme, m, lambda s: s["val_top1"]["final"])
            if best:
                ax.plot(*zip(*best), marker="o", color=color[m], label=f"{m}: best")
                ax.plot(*zip(*final), marker="x", ls="--", color=color[m], label=f"{m}: final")
        ax.set(title=titles[scheme], xlabel="ranks (world size)", ylabel="validation top-1 (%)")
        ranks_axis(ax, scheme)
        ax.legend(fontsize=7)
        ax = axes[row, 1]
        method_lines(ax, scheme, lambda s: s["compression_ratio"])
        ax.axhline(1.0, color="k", lw=0.8, ls=":")
        ax.annotate(
            "1:1 (A and B as large as W)",
            (0.02, 1.0),
            xycoords=("axes fraction", "data"),
            fontsize=7,
            va="top",
        )
        ax.set(
            title=titles[scheme],
            xlabel="ranks (world size)",
            ylabel="compression (full size / size at the end)",
        )
        ranks_axis(ax, scheme)
        ax.legend(fontsize=7)
    save(
        fig,
        "accuracy_compression_vs_ranks.png",
        "Top row: runs at constant local batch (each rank keeps its batch, so the global "
        "batch grows with the ranks); bottom row: runs at constant global batch "
        f"({reference} split over the ranks). Left: validation top-1 at its best evaluation "
        "(solid) and at the last one (dashed) against the number of ranks; right: the "
        "model's compression at the end (parameters of the full model over those of the "
        "trained one; ddp is 1:1 by definition). Above the dotted 1:1 line AB's factors are "
        "smaller than the weights they replace; below it they are larger.",
    )
    return made


CURVE_CAPTIONS = {
    "val_top1_vs_step": (
        "Validation top-1 at each evaluation against the training step, one panel per "
        "scale (nodes × ranks per node, batch scheme), every method of that scale overlaid "
        "and labelled at their last point. Read the vertical gaps: accuracy at equal "
        "steps. Runs of one panel see the same images per step."
    ),
    "val_top1_vs_inter_node_mb": (
        "The same evaluations against the inter-node megabytes each rank had sent by "
        "then. A curve further left reached its accuracy with less network traffic; "
        "AB's curve climbs most steeply where an interval between evaluations was mostly "
        "AB phase, which sends nothing across nodes."
    ),
}


def curve_figures() -> list[tuple[str, str]]:
    """The DVC plots of reports/curves.json rendered (`pipeline.plots`), as (file under
    reports/, caption): those that have a curve to draw."""
    from pipeline import plots

    rendered = {path.stem for path in plots.render()}
    return [
        (f"figures/{name}.png", caption + f" ([SVG](figures/{name}.svg))")
        for name, caption in CURVE_CAPTIONS.items()
        if name in rendered
    ]


def search_comparison(folders: list[Path]) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """Each search's best error so far (search.compare), kept in
    reports/search_comparison.json and drawn: its curves, and the figure with its caption."""
    from search.compare import curves as search_curves
    from search.compare import plot

    results = [search_curves(f) for f in folders]
    FIGURES.mkdir(parents=True, exist_ok=True)
    plot(results, FIGURES / "search_comparison.png")
    atomic_write_text(REPORTS / "search_comparison.json", json.dumps(results, indent=2))
    caption = (
        "Each backend's best validation error (100 − top-1, %) so far against its "
        "evaluations (and wall time), on the same budget; lower and further left is a "
        "search that finds good settings sooner. Error here is the search's own short runs "
        "on its own data (`search.train`), not the training runs above."
    )
    return results, [("figures/search_comparison.png", caption)]
