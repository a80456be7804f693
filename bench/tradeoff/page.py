"""What the study says: the verdict, the figure (tradeoff.png) and the page (README.md)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from abtrain.run.progress import duration
from bench.tradeoff.fronts import best_within
from pipeline.report.markdown import span, table


def low_rank(pts: list[dict[str, Any]], steps: int) -> list[str]:
    """Which AB points cut ranks, by method and init, and what tells them apart: the
    cutoff, the learning rate, and what decay alone would have left."""
    ab = [p for p in pts if p["method"] in ("ab", "ab_powersgd")]
    if not ab:
        return ["No AB point finished."]
    cut = [p for p in ab if p["compression"] > 1.0]
    kept = [p for p in ab if p["compression"] <= 1.0]
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for p in ab:
        init = p["params"].get("model.init", "the profile's init (not searched)")
        groups.setdefault((p["method"], init), []).append(p)
    rows = [
        [m, init, f"{sum(p['compression'] > 1.0 for p in g)} of {len(g)}"]
        + [
            span([p["params"][k] for p in g if p["compression"] > 1.0], spec)
            if any(p["compression"] > 1.0 for p in g)
            else "—"
            for k, spec in (("ab.sigma_cutoff", ".2f"), ("optim.lr", ".2g"))
        ]
        + [
            span([p["params"][k] for p in g if p["compression"] <= 1.0], spec)
            if any(p["compression"] <= 1.0 for p in g)
            else "—"
            for k, spec in (("ab.sigma_cutoff", ".2f"), ("optim.lr", ".2g"))
        ]
        for (m, init), g in groups.items()
    ]
    said = (
        f"{len(cut)} of the {len(ab)} AB and AB + PowerSGD points compress (above 1:1: the "
        "ranks they keep hold fewer parameters than the full layers)"
        + (
            f", keeping {span([p['kept_rank'] for p in cut], '.0%')} of the rank at "
            f"{span([p['compression'] for p in cut], '.2f')}:1"
            if cut
            else ""
        )
        + (
            ". Decay alone cuts none of them"
            if min(p["decay"] for p in ab) > max(p["params"]["ab.sigma_cutoff"] for p in ab)
            else ". Decay alone could cut some"
        )
        + ": under AdamW's decoupled decay a direction no "
        f"gradient supports keeps exp(−wd·Σlr) of its singular value, "
        f"{span([p['decay'] for p in ab], '.3f')} over these {steps} steps at the points' "
        "weight decays and schedules, against cutoffs of "
        f"{span([p['params']['ab.sigma_cutoff'] for p in ab], '.2f')} of σ_max. Where ranks "
        "fall, training spread the singular values past the cutoff; the table sets the "
        "points that cut ranks beside those that keep them."
    )
    if cut and kept:
        said += (
            f" Their best top-1: {span([p['best_top1'] for p in cut], '.1f')}% where ranks "
            f"fall, {span([p['best_top1'] for p in kept], '.1f')}% where every rank is kept."
        )
    header = ["method", "init", "compress", "cutoff (cut)", "lr (cut)", "cutoff (kept)"]
    return [said, "", *table([*header, "lr (kept)"], rows)]


def budget_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """At each budget (and at DDP's own bytes), each method's point: of its front points
    within the budget trained again at other seeds, the best by those seeds' mean; where
    none was, its best within it on the search's seed."""
    pts = data["points"]
    methods = list(dict.fromkeys(p["method"] for p in pts))
    out = []
    for b in [*data["budgets"], 1.0]:
        for m in methods:
            chosen = [p for p in pts if p["method"] == m and b in p.get("chosen_at", [])]
            best = max(chosen, key=lambda p: p["best_top1"]) if chosen else best_within(pts, m, b)
            if best is not None:
                out.append(dict(budget=b, method=m, point=best))
    return out


def found_by(point: dict[str, Any]) -> str:
    """`optuna t3`, `propulate (≤ 40%) i0-w1-g0`: the search and its evaluation."""
    within = f" (≤ {point['budget']:.0%})" if point["budget"] else ""
    return f"{point['backend']}{within} {point['id']}"


KNOBS = {  # how the verdict names a point's values, shortest first
    "ab.sigma_cutoff": ("cutoff", ".2f"),
    "optim.weight_decay": ("wd", ".3g"),
    "powersgd.rank": ("rank", "d"),
    "localsgd.period": ("period", "d"),
    "diloco.period": ("period", "d"),
    "diloco.outer_lr": ("outer lr", ".2f"),
    "diloco.outer_momentum": ("momentum", ".2f"),
    "optim.lr": ("lr", ".2g"),
}


def settings_of(point: dict[str, Any]) -> str:
    said = []
    for key, (name, spec) in KNOBS.items():
        if key in point["params"]:
            said.append(f"{name} {format(point['params'][key], spec)}")
    return ", ".join(said)


def top1_of(point: dict[str, Any]) -> str:
    sd, n = point["best_top1_sd"], point.get("rerun_seeds", 0)
    if not n:
        return f"{point['best_top1']:.2f}% (the search's seed)"
    return f"{point['best_top1']:.2f}" + (
        f" ± {sd:.2f}% ({n} other seeds)" if sd is not None else "% (1 other seed)"
    )


def verdict(data: dict[str, Any]) -> str:
    """`At ≤ 10% of DDP's inter-node bytes the best top-1 is M (method: settings); ...`,
    each budget's winner over every method, DDP's best at its own bytes last."""
    rows = budget_rows(data)
    said = []
    for b in data["budgets"]:
        here = [r for r in rows if r["budget"] == b]
        if not here:
            said.append(f"at ≤ {b:.0%} of DDP's inter-node bytes no point was found")
            continue
        win = max(here, key=lambda r: r["point"]["best_top1"])
        p = win["point"]
        ab = [r["point"] for r in here if r["method"] == "ab" and r["point"] is not p]
        # local SGD: what AB's low rank is measured against (syncing rarely, no factors)
        local = [r["point"] for r in here if r["method"] == "localsgd" and r["point"] is not p]
        said.append(
            f"at ≤ {b:.0%} of DDP's inter-node bytes the best top-1 is {top1_of(p)}, "
            f"{p['method']} ({settings_of(p)}; {p['bytes_vs_ddp']:.0%} of the bytes, "
            f"{p['compression']:.2f}:1)"
            + (
                f", AB's best {top1_of(ab[0])} at {ab[0]['bytes_vs_ddp']:.0%} of the bytes, "
                f"{ab[0]['compression']:.2f}:1"
                if ab
                else (", AB has no point within it" if p["method"] != "ab" else "")
            )
            + (
                f", local SGD's best {top1_of(local[0])} at {local[0]['bytes_vs_ddp']:.0%}"
                if local
                else ""
            )
        )
    ddp = [r for r in rows if r["method"] == "ddp" and r["budget"] == 1.0]
    tail = ""
    if ddp:
        tail = f"; DDP itself reaches {top1_of(ddp[0]['point'])}"
    tail += "".join(f"; {x}" for x in with_length(data, rows))
    steps = data["points"][0]["steps"]
    first = said[0][0].upper() + said[0][1:]
    return (
        f"In {steps}-step runs ({searched(data)}): "
        + "; ".join([first[0].lower() + first[1:], *said[1:]])
        + tail
        + "."
    )


def searched(data: dict[str, Any]) -> str:
    """What the searches evaluated: "N configurations by Optuna, M by Propulate"."""
    done: dict[str, int] = {}
    if data.get("searches"):
        for x in data["searches"]:
            done[x["backend"]] = done.get(x["backend"], 0) + x["evaluations"]
    else:  # a record made before the searches' progress was kept: its finished points
        for p in data["points"]:
            done[p["backend"]] = done.get(p["backend"], 0) + 1
    names = {"optuna": "Optuna", "propulate": "Propulate"}
    return ", ".join(
        f"{n} {'configurations ' if i == 0 else ''}by {names.get(b, b)}"
        for i, (b, n) in enumerate(done.items())
    )


def with_length(data: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """At each budget, whether the methods' ranking holds when their chosen points train
    `long_steps` (mean over the same other seeds)."""
    said = []
    for b in data["budgets"]:
        here = [
            r["point"]
            for r in rows
            if r["budget"] == b and b in r["point"].get("long_at", []) and r["point"]["long_top1"]
        ]
        if len(here) < 2:
            continue
        long = {id(p): statistics.fmean(p["long_top1"]) for p in here}
        short = sorted(here, key=lambda p: -p["best_top1"])
        ranked = sorted(here, key=lambda p: -long[id(p)])
        n = min(len(p["long_top1"]) for p in here)
        holds = [p["method"] for p in short] == [p["method"] for p in ranked]
        first = short[0]["method"] == ranked[0]["method"]
        said.append(
            f"at {here[0]['long_steps']} steps ({n} seeds) the ranking within ≤ {b:.0%} "
            + ("holds" if holds else f"keeps {ranked[0]['method']} first" if first else "changes")
            + ": "
            + ", ".join(f"{p['method']} {long[id(p)]:.2f}%" for p in ranked)
        )
    return said


def draw(data: dict[str, Any], path: Path) -> None:
    """Top-1 against the share of DDP's bytes (log x): each method's points (circles from
    Optuna, squares from Propulate... in the method's colour), its front as a step line,
    seeds as error bars, the budgets as dashed lines."""
    from pipeline import style

    pts = data["points"]
    with style.matplotlib_defaults() as plt:
        fig, ax = plt.subplots(figsize=(8.5, 5.2))
        for m in style.ordered(p["method"] for p in pts):
            mine = [p for p in pts if p["method"] == m]
            colour = style.colour(m)
            for backend, shape in (("optuna", "o"), ("propulate", "s")):
                got = [p for p in mine if p["backend"] == backend]
                ax.scatter(
                    [p["bytes_vs_ddp"] for p in got],
                    [p["best_top1"] for p in got],
                    marker=shape, s=30, color=colour, alpha=0.6, edgecolors="none",
                )  # fmt: skip
                cut = [p for p in got if p["compression"] > 1.0]  # ringed: it compresses
                ax.scatter(
                    [p["bytes_vs_ddp"] for p in cut], [p["best_top1"] for p in cut],
                    marker=shape, s=60, facecolors="none", edgecolors="black", linewidths=0.9,
                )  # fmt: skip
            front = sorted((p for p in mine if p["front"]), key=lambda p: p["bytes_vs_ddp"])
            if front:
                ax.step(
                    [p["bytes_vs_ddp"] for p in front],
                    [p["best_top1"] for p in front],
                    where="post", color=colour, lw=1.8, label=m,
                )  # fmt: skip
            seeded = [p for p in mine if p.get("rerun_seeds")]
            if seeded:
                ax.errorbar(
                    [p["bytes_vs_ddp"] for p in seeded],
                    [p["best_top1"] for p in seeded],
                    yerr=[p["best_top1_sd"] or 0.0 for p in seeded],
                    # a white edge: black rings mean "compresses" on this figure
                    fmt="D", ms=6, color=colour, mec="white", mew=0.8, capsize=3, lw=1.2,
                )  # fmt: skip
        for b in data["budgets"]:
            ax.axvline(b, color="grey", ls="--", lw=0.8)
            ax.annotate(
                f"≤ {b:.0%}", (b, 1.0), xycoords=("data", "axes fraction"),
                xytext=(3, -12), textcoords="offset points", color="grey", fontsize=9,
            )  # fmt: skip
        ax.set_xscale("log")
        low = min(p["bytes_vs_ddp"] for p in pts) * 0.8
        ticks = [t for t in (0.01, 0.02, 0.05, 0.1, 0.2, 0.4, 1.0) if t >= low]
        ax.set_xticks(ticks, [f"{t:.0%}" for t in ticks])
        ax.set_xlim(low, 1.25)
        ax.set_xticks([], minor=True)
        ax.set_xlabel("inter-node bytes per rank, share of DDP's (log)")
        ax.set_ylabel("best validation top-1 (%)")
        steps = pts[0]["steps"]
        ax.set_title(
            f"Accuracy against bytes, {steps}-step runs: fronts as lines; ● Optuna, ■ "
            "Propulate;\n◆ mean ± sd over seeds; ringed in black: the point compresses (> 1:1)",
            fontsize=10,
        )
        ax.legend(loc="lower right", fontsize=9)
        style.save(fig, path, dpi=110)
        plt.close(fig)


PROGRESS_FIGURE = "hypervolume.png"


def progress_rows(data: dict[str, Any]) -> list[list[Any]]:
    """A row per search: its evaluations, its random start, and where its hypervolume last
    rose (still rising in its last third, or flat since)."""
    rows = []
    for x in data["searches"]:
        n, last = x["evaluations"], x["last_rise"]
        where = (
            (
                "never: no finished point"
                if not x.get("finished", 0)
                else "never: its points add no area (at DDP's bytes, the reference)"
            )
            if last is None
            else f"at {last} of {n}: "
            + ("still rising in its last third" if last > n - n / 3 else "flat since")
        )
        start = f"{x['random_start']} random" + (
            " (TPE after)" if x["backend"] == "optuna" else " (bred after)"
        )
        budget = (
            f"≤ {x['budget']:.0%}"
            if x["budget"]
            else ("both objectives" if x["backend"] == "optuna" else "error alone")
        )
        rows.append([x["method"], x["backend"], budget, n, start, where])
    return rows


def draw_progress(data: dict[str, Any], path: Path) -> None:
    """Each search's hypervolume against its evaluations: Optuna's searches left (both
    objectives), Propulate's right (each under its budget), a line per search in its
    method's colour."""
    from pipeline import style

    with style.matplotlib_defaults() as plt:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True, layout="constrained")
        for ax, backend in zip(axes, ("optuna", "propulate")):
            for x in (x for x in data["searches"] if x["backend"] == backend):
                look = style.marker(x["method"])
                look.update(ms=4, ls="--" if x["budget"] == max(data["budgets"]) else "-")
                label = x["method"] + (f" (≤ {x['budget']:.0%})" if x["budget"] else "")
                curve = x["hypervolume"]
                ax.plot(range(1, len(curve) + 1), curve, label=label, **look)
                if x["random_start"]:
                    ax.axvline(x["random_start"] + 0.5, color=look["color"], lw=0.6, ls=":")
            ax.set(
                title=f"{backend}: "
                + ("both objectives" if backend == "optuna" else "error under a budget"),
                xlabel="evaluations, in the order they finished",
            )
            ax.grid(alpha=0.3)
            ax.xaxis.get_major_locator().set_params(integer=True)
            if ax.lines:
                ax.legend(fontsize=7)
        axes[0].set_ylabel("hypervolume (share of DDP's bytes × top-1 points)")
        style.save(fig, path, dpi=100)
        plt.close(fig)


def page(data: dict[str, Any]) -> str:
    pts = data["points"]
    s = data["settings"]
    steps = pts[0]["steps"]
    lines = [
        "# Accuracy against inter-node bytes",
        "",
        f"Made {data['made']} by `{data['command']}` ({duration(data['seconds'])} of "
        "searches and runs on this 2-core machine); every figure below from `points.json`.",
        "",
        f"**{data['verdict']}**",
        "",
        "![tradeoff](tradeoff.png)",
        "",
        f"*Best validation top-1 against inter-node bytes per rank as a share of DDP's "
        f"({data['ddp_bytes'] / 1e6:,.1f} MB per rank in {steps} steps), log x. A line is a "
        "method's front (no other of its points is as accurate for fewer bytes); diamonds "
        "with error bars are the points rerun at other seeds than the search's (their "
        "mean ± sd).*",
        "",
        "## Each method's best within each budget",
        "",
    ]
    rows = []
    for r in budget_rows(data):
        p = r["point"]
        rows.append(
            [
                f"≤ {r['budget']:.0%}",
                p["method"],
                top1_of(p),
                f"{p['bytes_vs_ddp']:.1%}",
                f"{p['compression']:.2f}:1",
                f"{p['kept_rank']:.0%}",
                found_by(p),
                settings_of(p),
            ]
        )
    lines += table(
        ["budget", "method", "best top-1", "bytes vs DDP", "compression", "kept rank",
         "found by", "settings"],
        rows,
    )  # fmt: skip
    if data.get("searches"):
        lines += [
            "",
            "## How each search went",
            "",
            f"![each search's hypervolume]({PROGRESS_FIGURE})",
            "",
            "*Each search's hypervolume after each evaluation: the area of (share of DDP's "
            "bytes, top-1) that its points dominate against (100% of DDP's bytes, 0%); it "
            "rises when a point beats the search's front on accuracy for its bytes. A dotted "
            "line ends a search's random start: Optuna's start-up trials (TPE proposes "
            "after), Propulate's first population (it breeds after).*",
            "",
        ]
        lines += table(
            [
                "method",
                "backend",
                "searched",
                "evaluations",
                "random start",
                "hypervolume last rose",
            ],
            progress_rows(data),
        )
    lines += ["", "## AB's low-rank regime", "", *low_rank(pts, steps), ""]
    lines += [
        "## What ran",
        "",
    ]
    searched = {}
    for p in pts:
        searched.setdefault((p["method"], p["backend"], p["budget"]), 0)
        searched[(p["method"], p["backend"], p["budget"])] += 1
    per_method = {}
    for (m, _, _), n in searched.items():
        per_method[m] = per_method.get(m, 0) + n
    lines += table(
        ["method", "backend", "searched", "finished points"],
        [
            [m, b, f"error under {budget:.0%} of DDP's bytes" if budget else "error alone", n]
            if b == "propulate"
            else [m, b, "both objectives", n]
            for (m, b, budget), n in searched.items()
        ],
    )
    lines += [
        "",
        "Points per method, both backends: "
        + ", ".join(f"{m} {n}" for m, n in per_method.items())
        + ". Seeds: at each budget each method's best point within it was trained again at "
        f"{max((p.get('rerun_seeds', 0) for p in pts), default=0)} seed(s) other than the one "
        f"the search chose it on (`abtrain.launch`, {s['nodes']} nodes × "
        f"{data['ranks_per_node']} rank), and its top-1 is theirs alone: chosen as the best of "
        "many on one seed, a point's own seed flatters it. A point found by both backends is "
        "one row. "
        "Each search's runs: `train` with " + ", ".join(f"`{x}`" for x in s["train"]) + ".",
        "",
        "## Every point",
        "",
    ]
    lines += table(
        ["method", "found by", "best top-1", "bytes vs DDP", "compression", "kept rank",
         "front", "settings"],
        [
            [p["method"], found_by(p), top1_of(p), f"{p['bytes_vs_ddp']:.1%}",
             f"{p['compression']:.2f}:1", f"{p['kept_rank']:.0%}", "yes" if p["front"] else "",
             settings_of(p)]
            for p in sorted(pts, key=lambda p: (p["method"], p["bytes_vs_ddp"]))
        ],
    )  # fmt: skip
    return "\n".join(lines) + "\n"
