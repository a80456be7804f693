"""The report's figures (matplotlib), each with its caption, under reports/figures/.

The validation curves are DVC plots, rendered offline by `pipeline.plots` (its own command,
`python -m pipeline.plots`, and dvc.yaml's `plots:`); here they get their captions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from abtrain.files import write_record
from pipeline import style
from pipeline.report.tables import REPORTS, per_step

FIGURES = REPORTS / "figures"


def in_scheme(s: dict, scheme: str, p: dict) -> bool:
    """Constant-local scaling: runs with the local batch scheme; constant-global scaling:
    runs whose global batch is the reference (the 2x2 local runs belong to both)."""
    if scheme == "local":
        return s["run"]["batch"] == "local"
    return s["run"]["global_batch"] == p["experiments"]["reference_global_batch"]


@dataclass
class Panels:
    """What every panel against the ranks draws from: the runs, each method's look and the
    sideways spread of its points, the seed studies' error bars."""

    done: dict[str, dict]
    p: dict
    seeds: dict[str, dict[str, float]]
    methods: list[str] = field(init=False)
    dodge: dict[str, float] = field(init=False)

    def __post_init__(self) -> None:
        self.methods = style.ordered(s["method"] for s in self.done.values())
        self.dodge = style.offsets(self.methods, 0.05)  # in ranks; ticks stay at the counts

    @property
    def reference(self) -> int:
        return self.p["experiments"]["reference_global_batch"]

    def title(self, scheme: str) -> str:
        if scheme == "local":
            return "constant local batch (global batch grows with ranks)"
        return f"constant global batch ({self.reference} in all)"

    def points(self, scheme: str, method: str, value) -> list[tuple[float, float]]:
        return sorted(
            (s["world_size"] + self.dodge[method], value(s))
            for s in self.done.values()
            if s["method"] == method and in_scheme(s, scheme, self.p)
        )

    def method_lines(self, ax, scheme: str, value, nested: bool = False) -> None:
        """One line per method of `value` against the ranks, in the method's style;
        `nested`: each line thinner than the one drawn before it, so lines of equal values
        (every AB method's 0.75:1) show every colour."""
        for i, m in enumerate(self.methods):
            pts = self.points(scheme, m, value)
            look = style.marker(m)
            if nested:
                look["lw"] = 1.2 + 2.0 * (len(self.methods) - 1 - i)
            if pts:
                ax.plot(*zip(*pts), **look, label=m)

    def ranks_axis(self, ax, scheme: str) -> None:
        worlds = sorted(
            {s["world_size"] for s in self.done.values() if in_scheme(s, scheme, self.p)}
        )
        ax.set_xticks(worlds)
        ax.grid(alpha=0.3)


def figures(
    done: dict[str, dict], p: dict, studies: list[dict[str, Any]] | None = None
) -> list[tuple[str, str]]:
    """The matplotlib figures, as (file under reports/, caption). Each method in its colour
    and marker of pipeline.style, as in every other figure; the points of one rank count
    spread a little sideways, so that equal values do not hide one another; one legend per
    figure, outside the panels. `studies` (tables.seed_studies) put error bars on the
    best top-1 of the runs a seed study made with the runs' own values covers."""
    panels = Panels(done, p, study_top1(studies or []))
    FIGURES.mkdir(parents=True, exist_ok=True)
    with style.matplotlib_defaults() as plt:
        return [traffic_figure(panels, plt), accuracy_figure(panels, plt)]


def save(fig, name: str, caption: str) -> tuple[str, str]:
    style.save(fig, FIGURES / name, dpi=100)
    return f"figures/{name}", caption


def traffic_figure(panels: Panels, plt) -> tuple[str, str]:
    """Like the paper's Figure 1: traffic against the ranks, at each batch scheme."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
    for ax, scheme in zip(axes, ("local", "global")):
        panels.method_lines(ax, scheme, lambda s: per_step(s) / 1e6)
        ax.set(
            title=panels.title(scheme),
            xlabel="ranks (world size)",
            ylabel="inter-node MB per step per rank",
        )
        panels.ranks_axis(ax, scheme)
    fig.legend(handles=style.handles(panels.methods), loc="outside right upper", fontsize=8)
    return save(
        fig,
        "traffic_vs_scale.png",
        "Inter-node megabytes each rank sends per training step (mean over ranks, whole "
        "run: warm-up, AB phases, syncs and rebounds), against the number of ranks; left "
        "at constant local batch, right at constant global batch. Lower is less network "
        "traffic; the gap between a method's line and ddp's is its saving. The bytes of "
        "a step do not depend on the batch, so a point shared by both panels has one "
        "value. Each method has its colour and marker in every figure; the points of a "
        "rank count are spread slightly sideways so that close values stay visible.",
    )


def top1_panel(ax, panels: Panels, scheme: str) -> None:
    """Best and final top-1 against the ranks, with the seed studies' error bars."""
    for m in panels.methods:
        best = panels.points(scheme, m, lambda s: s["val_top1"]["best"])
        final = panels.points(scheme, m, lambda s: s["val_top1"]["final"])
        if best:  # final: a larger open marker under best's, seen around it
            ring = style.marker(m)
            ring.update(ms=1.6 * ring["ms"], mfc="none", mec=ring["color"], mew=1.0)
            ring["zorder"] -= 1
            ax.plot(*zip(*final), **ring, ls="--")
            ax.plot(*zip(*best), **style.marker(m))
    for s in panels.done.values():
        if s["run"]["name"] in panels.seeds and in_scheme(s, scheme, panels.p):
            sd = panels.seeds[s["run"]["name"]]["std"]
            x = s["world_size"] + panels.dodge[s["method"]]
            colour = style.COLOURS.get(s["method"], "black")
            ax.errorbar(x, s["val_top1"]["best"], yerr=sd, fmt="none", ecolor=colour, capsize=3)
    ax.set(title=panels.title(scheme), xlabel="ranks (world size)", ylabel="validation top-1 (%)")
    panels.ranks_axis(ax, scheme)


def compression_panel(ax, panels: Panels, scheme: str) -> None:
    """The compression at the end against the ranks, with the 1:1 line."""
    panels.method_lines(ax, scheme, lambda s: s["compression_ratio"], nested=True)
    # above the method lines: DDP's thick nested line lies on 1:1 and would hide it
    ax.axhline(1.0, color="k", lw=0.9, ls=":", zorder=3)
    ax.annotate(
        "1:1 (A and B as large as W)",
        (0.5, 1.0),
        xycoords=("axes fraction", "data"),
        xytext=(0, -3),
        textcoords="offset points",
        fontsize=7,
        ha="center",
        va="top",
    )
    ax.set(
        title=panels.title(scheme),
        xlabel="ranks (world size)",
        ylabel="compression (full size / size at the end)",
    )
    panels.ranks_axis(ax, scheme)


def accuracy_figure(panels: Panels, plt) -> tuple[str, str]:
    """Like the paper's Figures 3-7, against the ranks: top-1 left, compression right."""
    fig, axes = plt.subplots(2, 2, figsize=(12.5, 7.5), layout="constrained")
    for row, scheme in enumerate(("local", "global")):
        top1_panel(axes[row, 0], panels, scheme)
        compression_panel(axes[row, 1], panels, scheme)
    key = style.handles(panels.methods) + [
        plt.Line2D([], [], color="grey", marker="o", mec="black", mew=0.5, label="top-1: best"),
        plt.Line2D(
            [], [], color="grey", marker="o", ms=10, mfc="none", ls="--", label="top-1: final"
        ),
    ]
    fig.legend(handles=key, loc="outside right upper", fontsize=8)
    return save(
        fig,
        "accuracy_compression_vs_ranks.png",
        "Top row: runs at constant local batch (each rank keeps its batch, so the global "
        "batch grows with the ranks); bottom row: runs at constant global batch "
        f"({panels.reference} split over the ranks). Left: validation top-1 at its best "
        "evaluation (solid line, filled marker) and at the last one (dashed line, open "
        "ring: around the filled marker where the two are equal), with an error bar of ± "
        "the sample sd of that run's best top-1 over its seed study where one is made with "
        "the runs' own values (`reports/seeds-best-*`; one seed each otherwise) "
        "against the number of ranks; right: the model's compression at the end "
        "(parameters of the full model over those of the trained one; ddp is 1:1 by "
        "definition). Above the dotted 1:1 line AB's factors are smaller than the weights "
        "they replace; below it they are larger.",
    )


def study_top1(studies: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Best top-1 over seeds (`mean`, `std`, `n`) of every run that a seed study made with
    the runs' own values (tables.seed_studies: `matches`) covers, by run name."""
    out: dict[str, dict[str, float]] = {}
    for study in studies:
        if study["matches"]:
            for name, m in study["data"]["summary"]["methods"].items():
                if m["best_top1"].get("std") is not None:
                    out.setdefault(name, m["best_top1"])
    return out


def verdict_figure(done: dict[str, dict], studies: list[dict[str, Any]]) -> tuple[str, str] | None:
    """The verdict at a glance: at the scale with the most methods, each method's best top-1
    (mean ± sd over its seed study where one matches the runs, else its one run, open)
    against its inter-node bytes over DDP's. None without a ddp run to compare with."""
    shapes: dict[tuple, list[dict]] = {}
    for s in done.values():
        key = (s["run"]["nodes"], s["run"]["ranks_per_node"], s["run"]["batch"])
        shapes.setdefault(key, []).append(s)
    (nodes, ranks, batch), group = max(
        shapes.items(), key=lambda kv: (len({s["method"] for s in kv[1]}), kv[0])
    )
    ddp = next((s for s in group if s["method"] == "ddp"), None)
    if ddp is None:
        return None
    seeds = study_top1(studies)
    name = "verdict.png"
    with style.matplotlib_defaults() as plt:
        fig, ax = plt.subplots(figsize=(7.5, 4.5), layout="constrained")
        for s in sorted(group, key=lambda s: style.rank(s["method"])):
            x = per_step(s) / per_step(ddp)
            m, run = s["method"], s["run"]["name"]
            if run in seeds:
                y, sd, n = seeds[run]["mean"], seeds[run]["std"], seeds[run]["n"]
                ax.errorbar(x, y, yerr=sd, capsize=4, **style.marker(m))
                label = f"{m}\n{y:.1f} ± {sd:.1f} ({n} seeds)"
            else:
                y = s["val_top1"]["best"]
                ax.plot(x, y, **style.marker(m, filled=False))
                label = f"{m}\n{y:.1f} (1 seed)"
            ax.annotate(
                label,
                (x, y),
                xytext=(8, 0),
                textcoords="offset points",
                fontsize=8,
                va="center",
                color=style.COLOURS.get(m, "black"),
            )
        ax.set_xscale("log")
        ax.set_xticks([0.05, 0.1, 0.2, 0.5, 1.0], labels=["0.05", "0.1", "0.2", "0.5", "1"])
        ax.set_xlim(0.05, 2.0)
        ax.grid(alpha=0.3)
        ax.set(
            xlabel="inter-node bytes per rank, over DDP's (log scale; left is less traffic)",
            ylabel="best validation top-1 (%)",
            title=f"{nodes} nodes × {ranks} ranks, {batch} batch: accuracy against traffic",
        )
        FIGURES.mkdir(parents=True, exist_ok=True)
        style.save(fig, FIGURES / name, dpi=100)
    return (
        f"figures/{name}",
        f"Each method at {nodes} nodes × {ranks} ranks: best validation top-1 against the "
        "inter-node bytes it sends, over DDP's. Filled with an error bar: mean ± sample sd "
        "over a seed study made with the runs' own values (`reports/seeds-best-*`); open: "
        "the matrix's one run, no study. Up and to the left is better: more accuracy for "
        "less traffic.",
    )


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
    with style.matplotlib_defaults():  # search.compare draws it; no matplotlibrc of ours
        plot(results, FIGURES / "search_comparison.png")
    style.strip_png_text(FIGURES / "search_comparison.png")  # matplotlib's version: not drawn
    write_record(REPORTS / "search_comparison.json", results)
    caption = (
        "Each backend's best validation error (100 − top-1, %) so far against its "
        "evaluations (and wall time), on the same budget; lower and further left is a "
        "search that finds good settings sooner. Error here is the search's own short runs "
        "on its own data (`search.train`), not the training runs above."
    )
    return results, [("figures/search_comparison.png", caption)]
