"""Stage `report`: reports/ from the runs' results, their learning curves and the searches,
beside the paper's published values. Generated; never edit reports/ by hand. Missing runs
leave a gap (—) in the tables, not a crash.

Reads results/NAME.json (each run's summary and its place in the matrix) and plots/NAME.json
(its validation curve); writes reports/README.md, the tables as CSV, reports/curves.json
(every run's curve in one file, for `dvc plots show`), reports/metrics/NAME.json (DVC
metrics: each run's inter-node bytes per step against its ddp run's; one file per run, so
`dvc metrics show` adds one column, not one per run) and the figures.
"""

from __future__ import annotations

import csv
import io
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

from abtrain import config as abconfig
from abtrain import schedule
from abtrain.checkpoint import atomic_write_text
from pipeline.common import RUNS, SEARCHES, params, runs

REPORTS = Path("reports")
FIGURES = REPORTS / "figures"
METRICS = REPORTS / "metrics"
RESULTS = Path("results")
PLOTS = Path("plots")
PAPER = Path("pipeline/paper_reference.json")
PLANNER = Path("bench/results/planner.json")
DASH = "—"
TABLEAU10 = ["#4c78a8", "#f58518", "#e45756", "#72b7b2", "#54a24b", "#eeca3b", "#b279a2"]
SCALE_KEYS = ("nodes", "ranks_per_node", "batch", "model", "data")


def fmt(x: Any, spec: str = ".2f", unit: str = "") -> str:
    return DASH if x is None else format(x, spec) + unit


def load_runs(p: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out = {}
    for name in runs(p):
        path = RESULTS / f"{name}.json"
        if path.exists():
            out[name] = json.loads(path.read_text())
    return out


def baseline(done: dict[str, dict], s: dict) -> dict | None:
    """The ddp run of the same model, data, scale and batch scheme."""
    for other in done.values():
        r, o = s["run"], other["run"]
        if other["method"] == "ddp" and all(o.get(k) == r.get(k) for k in SCALE_KEYS):
            return other
    return None


def per_step(s: dict) -> float:
    return s["traffic"]["inter_node_bytes"] / s["steps"]


def vs_ddp(done: dict[str, dict]) -> dict[str, dict[str, float]]:
    """reports/metrics/NAME.json: inter-node bytes per step over the ddp run's of the same
    scale and batch scheme (runs without such a ddp run are left out)."""
    out = {}
    for name, s in done.items():
        base = baseline(done, s)
        if base is not None:
            out[name] = {"vs_ddp": round(per_step(s) / per_step(base), 6)}
    return out


def write_metrics(ratios: dict[str, dict[str, float]]) -> None:
    """One small metrics file per run (and none left of runs no longer in the matrix)."""
    METRICS.mkdir(parents=True, exist_ok=True)
    for stale in METRICS.glob("*.json"):
        if stale.stem not in ratios:
            stale.unlink()
    for name, m in ratios.items():
        atomic_write_text(METRICS / f"{name}.json", json.dumps(m, indent=2))


def ecr(compression: float, f: float = 25.0, low: float = 75.0) -> float:
    """The paper's Eq. 4: 100% − F − L·c, c the final size as a percentage of full."""
    return 100.0 - f - low * (100.0 / compression) / 100.0


def ecr_groups(cfg: abconfig.Config) -> float:
    """Eq. 4 read the paper's way for AB (*): steps spent in AB phases send nothing."""
    kinds = [schedule.phase_at(t, cfg).kind for t in range(cfg.steps)]
    return 100.0 * kinds.count("ab") / len(kinds)


def accuracy(done: dict[str, dict]) -> list[dict[str, Any]]:
    """Absolute top-1 (best and final evaluation) beside the difference to the ddp run."""
    rows = []
    for name, s in done.items():
        base = baseline(done, s)
        own = base is s
        best, final = s["val_top1"]["best"], s["val_top1"]["final"]
        rows.append(
            dict(
                run=name,
                method=s["method"],
                nodes=s["run"]["nodes"],
                ranks_per_node=s["run"]["ranks_per_node"],
                batch=s["run"]["batch"],
                global_batch=s["run"]["global_batch"],
                steps=s["steps"],
                best_top1=best,
                final_top1=final,
                diff_best=None if base is None or own else best - base["val_top1"]["best"],
                diff_final=None if base is None or own else final - base["val_top1"]["final"],
                min_val_loss=s["val_loss"]["min"],
            )
        )
    return rows


def table1(done: dict[str, dict]) -> list[dict[str, Any]]:
    rows = []
    for name, s in done.items():
        t, steps, secs = s["traffic"], s["steps"], s["wall_seconds"]
        base = baseline(done, s)
        rows.append(
            dict(
                run=name,
                method=s["method"],
                nodes=s["run"]["nodes"],
                ranks_per_node=s["run"]["ranks_per_node"],
                batch=s["run"]["batch"],
                global_batch=s["run"]["global_batch"],
                inter_bytes_per_step=t["inter_node_bytes"] / steps,
                inter_gb_per_s=t["inter_node_bytes"] / secs / 1e9,
                total_bytes_per_step=t["total_bytes"] / steps,
                ratio_to_ddp=(
                    t["inter_node_bytes"] / base["traffic"]["inter_node_bytes"] if base else None
                ),
                # the paper's quantity: GB/s per process over wall time, AB's over DDP's
                rate_ratio_to_ddp=(
                    (t["inter_node_bytes"] / secs)
                    / (base["traffic"]["inter_node_bytes"] / base["wall_seconds"])
                    if base
                    else None
                ),
                **(gap_parts(s, base) if base and s["method"] != "ddp" else {}),
            )
        )
    return rows


def gap_parts(s: dict, base: dict) -> dict[str, float]:
    """AB's inter-node bytes over DDP's, split by where they are sent (each part over DDP's
    total), and the factor wall time adds to make it a ratio of GB/s."""
    ddp = base["traffic"]["inter_node_bytes"]
    phases = {k: v["inter"] for k, v in s["traffic"]["by_phase"].items()}
    full = sum(phases.pop(k, 0.0) for k in ("warmup", "rebound", "full"))
    sync = phases.pop("sync", 0.0) + phases.pop("factorize", 0.0)
    ab = phases.pop("ab", 0.0)
    return dict(
        part_full_rank_steps=full / ddp,
        part_syncs=sync / ddp,
        part_ab_steps=ab / ddp,
        part_other=sum(phases.values()) / ddp,
        time_factor=base["wall_seconds"] / s["wall_seconds"],
    )


# the AB methods whose AB phases send nothing across groups (ECR*)
GROUPS_IN_NODES = ("ab", "ab_individual", "ab_powersgd")


def saved_config(path: Path) -> abconfig.Config | None:
    """A run folder's config; None where there is none, or it is of an older abtrain."""
    try:
        return abconfig.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError):  # ConfigError is a ValueError
        return None


def table2(done: dict[str, dict], p: dict) -> list[dict[str, Any]]:
    rows = []
    for name, s in done.items():
        if s["method"] not in abconfig.AB_METHODS:  # nothing factorised: no compression
            continue
        base = baseline(done, s)
        cfg = saved_config(RUNS / "train" / name / "config.json")  # ECR* needs its schedule
        c = s["compression_ratio"]
        rows.append(
            dict(
                run=name,
                method=s["method"],
                diff_top1=(s["val_top1"]["best"] - base["val_top1"]["best"]) if base else None,
                compression=c,
                ecr=ecr(c),
                ecr_groups=(ecr_groups(cfg) if cfg and s["method"] in GROUPS_IN_NODES else None),
                measured_reduction=(
                    100
                    * (1 - s["traffic"]["inter_node_bytes"] / base["traffic"]["inter_node_bytes"])
                    if base
                    else None
                ),
                ranks_kept=ranks_kept(s),
            )
        )
    return rows


def ranks_kept(s: dict) -> float | None:
    """The share of factorised layers whose rank at the last factorisation is still that
    of the first: how much the SVD's cutoff cut over the run."""
    f = s.get("factorizations") or []
    if not f or not f[0]["ranks"]:
        return None
    first, last = f[0]["ranks"], f[-1]["ranks"]
    return sum(last.get(k) == v for k, v in first.items()) / len(first)


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    buf = io.StringIO()
    if rows:
        # rows may differ in columns (AB's parts of its traffic): every column, in order
        w = csv.DictWriter(buf, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        w.writeheader()
        w.writerows(rows)
    atomic_write_text(path, buf.getvalue())


# ---------------------------------------------------------------- curves
def scales(done: dict[str, dict]) -> list[tuple]:
    """The matrix's scales (nodes, ranks per node, batch scheme, model, data), in its order."""
    return list(dict.fromkeys(tuple(s["run"].get(k) for k in SCALE_KEYS) for s in done.values()))


def scale_label(s: dict, several_models: bool) -> str:
    r = s["run"]
    label = (
        f"{r['nodes']} nodes × {r['ranks_per_node']} rank{'s' * (r['ranks_per_node'] > 1)}, "
        f"{r['batch']} batch "
        f"({r['global_batch'] // (r['nodes'] * r['ranks_per_node'])}/rank, "
        f"{r['global_batch']} global)"
    )
    return f"{r.get('model')} on {r.get('data')}: {label}" if several_models else label


def curves(done: dict[str, dict]) -> list[dict[str, Any]]:
    """Every run's evaluations as rows {run, method, scale, step, val_top1, inter_node_mb, ...}:
    from plots/NAME.json, or the summary's own evaluations where that file lacks traffic."""
    order = scales(done)
    several = len({(k[3], k[4]) for k in order}) > 1
    rows = []
    for name, s in done.items():
        path = PLOTS / f"{name}.json"
        own = json.loads(path.read_text()) if path.exists() else []
        if not own or any("inter_node_mb" not in r for r in own):
            own = [
                dict(
                    step=e["step"],
                    val_top1=e["val_top1"],
                    val_loss=e["val_loss"],
                    inter_node_mb=(
                        e["inter_node_bytes"] / 1e6 if "inter_node_bytes" in e else None
                    ),
                    samples=e.get("samples"),
                )
                for e in s.get("evals", [])
            ]
        key = tuple(s["run"].get(k) for k in SCALE_KEYS)
        extra = dict(
            run=name,
            method=s["method"],
            scale=scale_label(s, several),
            scale_order=order.index(key),
        )
        rows += [{**r, **extra} for r in own]
    return rows


# ---------------------------------------------------------------- figures
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


def search_section(p: dict[str, Any]) -> tuple[list[tuple[str, str]], str]:
    folders = [f for f in sorted(SEARCHES.glob("*")) if (f / "evaluations.jsonl").exists()]
    if not folders:
        return [], "No search ran.\n"
    from search.compare import curves as search_curves
    from search.compare import plot

    results = [search_curves(f) for f in folders]
    FIGURES.mkdir(parents=True, exist_ok=True)
    plot(results, FIGURES / "search_comparison.png")
    atomic_write_text(REPORTS / "search_comparison.json", json.dumps(results, indent=2))
    lines = [
        "| backend | evaluations | best error (%) | median error (%) | wall time (s) |",
        "|---|---|---|---|---|",
    ]
    for f, r in zip(folders, results):
        best = json.loads((f / "best.json").read_text()) if (f / "best.json").exists() else {}
        wall = r["curve"][-1]["seconds"] if r["curve"] else None
        lines.append(
            f"| {r['backend']} | {r['evaluations']} | {fmt(best.get('error'))} | "
            f"{fmt(best.get('median_error'))} | {fmt(wall, '.0f')} |"
        )
    caption = (
        "Each backend's best validation error (100 − top-1, %) so far against its "
        "evaluations (and wall time), on the same budget; lower and further left is a "
        "search that finds good settings sooner. Error here is the search's own short runs "
        "on its own data (`search.train`), not the training runs above."
    )
    lines += ["", *chosen_backend(p, folders), *rerun_spread()]
    return [("figures/search_comparison.png", caption)], "\n".join(lines) + "\n"


def rerun_spread() -> list[str]:
    """What rerunning the search moved (`python -m bench.search_reruns`), beside the seeds."""
    if not RERUNS.exists():
        return []
    d = json.loads(RERUNS.read_text())
    out = [
        "",
        f"What a rerun of the search moves ([`search-reruns/`](search-reruns/README.md), "
        f"`{d['command']}`): {len(d['rows'])} searches with the same settings, the first the "
        f"one whose record the runs above train from, and {' and '.join(d['runs'])} trained "
        "from each best (sd: sample standard deviation):",
        "",
        "| figure | mean | sd | min | max |",
        "|---|---|---|---|---|",
    ]
    for label, sp in d["spread"].items():
        out.append(
            f"| {label} | {sp['mean']:.3f} | {fmt(sp['std'], '.3f')} | {sp['min']:.3f} | "
            f"{sp['max']:.3f} |"
        )
    seeds = d.get("seed_spread")
    if seeds:
        out += [
            "",
            f"The same gap over seeds with the committed best ({seeds['of']}, "
            f"`{Path(seeds['study']).name}/`): mean {seeds['mean']:+.2f}, sd {seeds['std']:.2f}.",
        ]
    return out + ["", d["verdict"]]


def chosen_backend(p: dict[str, Any], folders: list[Path]) -> list[str]:
    """Which search's best trained the matrix, and why that one."""
    if not p["search"]["use_best"]:
        return ["The runs above train `train`'s own values (`search.use_best: []`)."]
    backend = p["search"]["backend"]
    errors = {
        f.name: json.loads((f / "best.json").read_text())["error"]
        for f in folders
        if (f / "best.json").exists()
    }
    lower = [b for b, e in errors.items() if backend in errors and e < errors[backend]]
    out = [
        f"The runs above train from **{backend}**'s best (`search.backend`; its record, "
        f"`results/search/{backend}/best.json`, is committed, so a fresh clone trains the "
        "same values)"
        + (
            ": Propulate is the paper's search, the one this reproduction follows."
            if backend == "propulate"
            else "."
        )
    ]
    if lower:
        text = (
            f"{', '.join(lower)} found a lower error on the same budget "
            f"({', '.join(f'{errors[b]:.2f}%' for b in lower)} against "
            f"{errors[backend]:.2f}%)"
        )
        if RERUNS.exists():
            sp = json.loads(RERUNS.read_text())["spread"]["best error (%)"]
            text += (
                f"; {sp['n']} {backend} searches with the same settings found "
                f"{sp['min']:.2f}-{sp['max']:.2f}% (below), so the gap between the backends "
                + ("is larger than" if min(errors[b] for b in lower) < sp["min"] else "is within")
                + " what a rerun moves"
            )
        out.append(
            text + ". Whether that best would also train a better matrix is not measured; "
            "the runs follow `search.backend`."
        )
    return out


# ---------------------------------------------------------------- notes beside the tables
def seed_noise() -> float | None:
    """The largest spread of one method's best top-1 across seeds (reports/seeds, from
    `python -m bench.seeds`), if that study is here."""
    path = REPORTS / "seeds" / "seeds.json"
    if not path.exists():
        return None
    methods = json.loads(path.read_text()).get("summary", {}).get("methods", {})
    spreads = [m["best_top1"]["range"] for m in methods.values() if "best_top1" in m]
    return max(spreads) if spreads else None


SEED_STUDY_SETS = ("seed=S", "tracking.enabled=false")  # every study's (bench.seeds)


def seed_pairs(p: dict[str, Any]) -> list[str]:
    """One line per seed study (reports/seeds*/, `python -m bench.seeds`): its pair's
    difference in best top-1 at each seed. A study trained from another search result than
    the committed record is another configuration: named apart, not summarised."""
    path = SEARCHES / p["search"]["backend"] / "best.json"
    record = json.loads(path.read_text()) if p["search"]["use_best"] and path.exists() else None
    out, other = [], []
    for path in sorted(REPORTS.glob("seeds*/seeds.json")):
        data = json.loads(path.read_text())
        if data.get("search_best_values") and (
            record is None or data.get("search_best") != record["params"]
        ):
            other.append(f"[`{path.parent.name}/`]({path.parent.name}/README.md)")
            continue
        d = data["summary"]["difference"]
        per, sp = d["per_seed"], d["spread"]
        if not sp:
            continue
        trained = "with" if data.get("search_best_values") else "without"
        extra = [x for x in data.get("overrides_extra", []) if x not in SEED_STUDY_SETS]
        also = f" and {', '.join(f'`{x}`' for x in extra)}" if extra else ""
        out.append(
            f"- [`{path.parent.name}/`]({path.parent.name}/README.md), {trained} the search's "
            f"values{also}: {d['of']} over seeds {', '.join(per)} is "
            + ", ".join(f"{v:+.2f}" for v in per.values())
            + f" points (mean {sp['mean']:+.2f})."
        )
    if other:
        out.append(
            f"- Trained from an earlier search result than the committed record (another "
            f"configuration, so not comparable with the tables above): {', '.join(other)}."
        )
    if not out:
        return []
    return ["", "Each study's pair, best top-1 in percentage points at each seed:", "", *out]


def accuracy_notes(rows: list[dict[str, Any]], noise: float | None) -> list[str]:
    out = [
        "Best: the highest of the run's evaluations; final: its last (the end of the run). "
        "Δ: the run minus the ddp run of the same scale and batch scheme, in percentage "
        "points (negative: below ddp); ddp rows have no Δ, they are the reference."
    ]
    if any(r["diff_best"] is not None and r["diff_best"] < 0 for r in rows):
        out.append(
            "Every run here is one seed. "
            + (
                f"Across seeds (`reports/seeds/`, `python -m bench.seeds`) one method's best "
                f"top-1 moves by up to {noise:.2f} points: a Δ smaller than that is within "
                "seed noise; its sign is what the seed study supports, not its size."
                if noise is not None
                else "Run `python -m bench.seeds` for the seed-to-seed spread before "
                "reading much into small differences."
            )
        )
    if any(r["best_top1"] != r["final_top1"] for r in rows):
        out.append(
            "Where best and final differ the run peaked before its end (evaluations are few, "
            "so one evaluation's noise decides it)."
        )
    return out


def traffic_notes(done: dict[str, dict], rows: list[dict[str, Any]]) -> list[str]:
    out = [
        "MB/step: the run's inter-node bytes over its steps, per rank (mean over ranks). "
        "bytes vs ddp: the run's inter-node bytes over those of the ddp run of the same "
        "scale and batch scheme (1.000 for ddp itself; the runs of one scale have the same "
        "steps, so this is also the ratio per step). GB/s vs ddp: the same over wall time, "
        "the paper's quantity."
    ]
    ddp = {(r["nodes"], r["ranks_per_node"]): r for r in rows if r["method"] == "ddp"}
    if any(rpn > 1 for _, rpn in ddp) and any(rpn == 1 for _, rpn in ddp):
        out.append(
            "ddp's MB/step falls as ranks are added on the same two nodes: gradients are "
            "all-reduced on a ring (2(n−1)/n of the gradient size per rank), and with 2 ranks "
            "per node only the hops from one node to the next cross the network, so the mean "
            "rank sends less across nodes (0.75× on 2 × 2 against 2 × 1)."
        )
    if len({r["batch"] for r in rows}) > 1:
        out.append(
            "The bytes of a step do not depend on the batch (same model, same gradients): "
            "the local and global runs of one scale send the same MB/step; their GB/s differ "
            "because a step of a larger batch takes longer."
        )
    return out


def compression_notes(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    low = [r for r in rows if r["compression"] < 1]
    if low:
        cs = sorted({round(r["compression"], 2) for r in low})
        kept = [r["ranks_kept"] for r in low if r["ranks_kept"] is not None]
        out.append(
            f"**Compression below 1:1** ({', '.join(f'{c:.2f}:1' for c in cs)}): the trained "
            "model is *larger* than the full one. A layer's factors A (m×r) and B (r×n) "
            "hold r(m+n) numbers where W holds mn, so factorising saves space only once the "
            "rank r falls below mn/(m+n) (half the width of a square layer). "
            + (
                "In these runs "
                + ("every one" if min(kept) == 1 else f"at least {100 * min(kept):.0f}%")
                + " of the factorised layers ended at the rank of their first factorisation "
                "(`factorizations` in "
                "results/NAME.json): in runs this short few singular values fall below "
                "`ab.sigma_cutoff`, so A and B stay larger than W. "
                if kept
                else ""
            )
            + "The traffic falls anyway (last column): in AB phases the groups train inside "
            "their node and send nothing across nodes. For a compression above 1:1 see "
            "`reports/table2/` below."
        )
    neg = [r for r in rows if r["ecr"] < 0]
    if neg:
        r = neg[0]
        c = 100 / r["compression"]
        out.append(
            f"**Negative ECR** ({r['ecr']:.1f}% for {r['compression']:.2f}:1): Eq. 4 "
            "charges the 75% of training the paper spends in low rank at the final size c, "
            f"as a percentage of the full model; below 1:1, c exceeds 100% ({c:.0f}% here), "
            "so the formula says these runs would send more than DDP (a negative reduction: "
            f"{-r['ecr']:.1f}% *more*). It prices sending the factors' gradients every "
            "step of the low-rank 75%; AB sends nothing across nodes in its AB phases, so "
            "the measured reduction, from the bytes actually sent, is the number to read."
        )
    if any(r["ecr_groups"] is None for r in rows):
        out.append(
            "ECR* is — for ab_nogroups: its one group spans every node, so its AB phases "
            "do send across nodes (B's gradient, r×n, by DDP over all ranks, in place of "
            "W's, m×n: smaller whenever r < m, hence a smaller measured reduction than ab's), "
            "and for any run whose config.json (runs/train/NAME) is not at hand."
        )
    return out


# ---------------------------------------------------------------- the page
def paper_scale_rates() -> list[str]:
    """Table 1 at the paper's scale, predicted: the planner's GB/s per process for the
    paper profile's ViT-B/16 and ResNet-50 runs (`python -m bench.planner`)."""
    if not PLANNER.exists():
        return []
    result = json.loads(PLANNER.read_text())
    rates, m = result.get("rates", []), result.get("rate_model", {})
    if not rates:
        return []
    md = [
        "",
        "### Table 1 at the paper's scale, predicted",
        "",
        "No run here has the paper's scale, so the planner predicts it "
        "([`bench/results/planner.json`](../bench/results/planner.json), "
        "`python -m bench.planner`): the inter-node bytes of the paper profile's runs "
        "(the authors' schedules, 4 GPUs per node) and a stated time model, each step its "
        f"compute at {m['flops_per_s'] / 1e12:.0f} TFLOP/s (torch's FLOP count of the step; "
        f"{m['utilisation']:.0%} of an A100's bf16 peak) plus its node's bytes over one "
        f"{m['link_bytes_per_s'] / 1e9:.0f} GB/s link, without overlap. Nothing is fitted "
        "to the paper's values.",
        "",
        "| model | N | batch | s/step ddp | GB/s ddp | GB/s ab | GB/s ab/ddp | bytes ab/ddp "
        "| GB/s ab/ddp, BN per group | full-rank steps | AB steps | syncs | other | paper ddp "
        "| paper ab | paper ab/ddp |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rates:
        md.append(
            f"| {r['model']} | {r['nodes']} | {r['batch']} | {r['ddp_step_seconds']:.3f} | "
            f"{r['ddp_gb_per_s']:.2f} | {r['ab_gb_per_s']:.2f} | {r['rate_ratio']:.3f} | "
            f"{r['bytes_ratio']:.3f} | {fmt(r.get('rate_ratio_group_bn'), '.3f')} | "
            f"{r['part_full_rank_steps']:.3f} | {r['part_ab_steps']:.3f} | "
            f"{r['part_syncs']:.4f} | {r['part_other']:.4f} | "
            f"{fmt(r['paper_ddp_gb_per_s'])} | {fmt(r['paper_ab_gb_per_s'])} | "
            f"{fmt(r['paper_ratio'], '.3f')} |"
        )
    moved = [
        r["rate_ratio"] - r["rate_ratio_group_bn"]
        for r in rates
        if r.get("sync_batchnorm") == "world" and r.get("rate_ratio_group_bn")
    ]
    gaps = [r["paper_ratio"] - r["rate_ratio"] for r in rates if r["paper_ratio"]]
    scale = [r["paper_ddp_gb_per_s"] / r["ddp_gb_per_s"] for r in rates if r["paper_ratio"]]
    md += [
        "",
        "N: nodes; batch: constant local (256 per GPU) or global (4,096) batch. "
        "The bytes ratio splits into its parts (each over DDP's bytes): the full-rank steps "
        "(warm-up and rebounds, which send what DDP sends), the AB steps (nothing crosses "
        "nodes there but ResNet-50's SyncBatchNorm statistics, over the world as the "
        "authors ran it), the syncs, and the rest (setup, evaluations, checkpoints). The GB/s "
        "ratio is the bytes ratio times DDP's step time over AB's: AB's steps in its "
        "independent phases don't wait for the network, so its rate ratio is above its "
        "bytes ratio, more so where the network is a larger share of DDP's step (many "
        f"nodes, small local batches). The paper's ratio minus the prediction is "
        f"{min(gaps):+.3f} to {max(gaps):+.3f}; the schedule (full-rank share) is the "
        "authors', so what remains is how the paper measured traffic and time. The "
        "absolute GB/s are not comparable: they hang on the stated compute rate, and the "
        f"paper's DDP rates are {min(scale):.1f}-{max(scale):.1f} times these.",
    ]
    if moved:
        md += [
            "",
            "ResNet-50's SyncBatchNorm is counted as the authors ran it (`dist.sync_batchnorm: "
            "world`): torch's SyncBatchNorm over the whole world, every step, AB phases "
            "included, all-gathering each rank's 2C+1 statistics per BatchNorm layer forward "
            "and all-reducing 2C gradients backward. Its bytes grow with the world, so they "
            "weigh most at 32 nodes. Against the same runs with the statistics over the "
            'phase\'s DDP group (column "BN per group": what an AB phase costs when its '
            "batch statistics stay inside the node), the ResNet-50 AB/DDP rate ratio moves "
            f"by {min(moved):+.3f} to {max(moved):+.3f}; ViT-B/16 has no BatchNorm.",
        ]
    return md


# ---------------------------------------------------------------- the README's opening
HEADLINE = REPORTS / "headline.md"
RERUNS = REPORTS / "search-reruns" / "reruns.json"


def span(values: list[float], spec: str) -> str:
    lo, hi = (format(v, spec) for v in (min(values), max(values)))
    return lo if lo == hi else f"{lo} to {hi}"


def headline(p: dict[str, Any], acc: list[dict], t1: list[dict]) -> str:
    """reports/headline.md: the README's opening, copied there between its markers (a test
    keeps the two equal), so the README's figures are the report's."""
    traffic = {r["run"]: r for r in t1}
    lines = [
        "| run | method | nodes × ranks | batch per rank | best top-1 | inter-node MB/step/rank "
        "| bytes vs ddp |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in acc:
        t = traffic[r["run"]]
        lines.append(
            f"| {r['run']} | {r['method']} | {r['nodes']} × {r['ranks_per_node']} | "
            f"{r['global_batch'] // (r['nodes'] * r['ranks_per_node'])} | "
            f"{r['best_top1']:.2f}% | {t['inter_bytes_per_step'] / 1e6:.2f} | "
            f"{fmt(t['ratio_to_ddp'], '.3f')} |"
        )
    text = []
    ab = [(a, traffic[a["run"]]) for a in acc if a["method"] == "ab" and a["diff_best"] is not None]
    if ab:
        text.append(
            f"AB training sends {span([t['ratio_to_ddp'] for _, t in ab], '.3f')} of DDP's "
            f"inter-node bytes at {span([-a['diff_best'] for a, _ in ab], '.2f')} points of "
            f"best top-1 below DDP ({len(ab)} scales, one seed each). (The paper's Table 1 "
            "ratio is of GB/s, bytes over wall time: the report gives it, and it moves with "
            "each run's time, which this headline leaves out so that it reproduces.)"
        )
    others = {}
    for a in acc:
        if a["method"] not in ("ddp", "ab") and a["diff_best"] is not None:
            others.setdefault(a["method"], []).append((a, traffic[a["run"]]))
    for method, rows in others.items():
        text.append(
            f"`{method}`: {span([t['ratio_to_ddp'] for _, t in rows], '.3f')} of DDP's bytes, "
            f"{span([a['diff_best'] for a, _ in rows], '+.2f')} points of best top-1."
        )
    if RERUNS.exists():
        d = json.loads(RERUNS.read_text())
        gap, ratio = d["spread"]["top1 gap (points)"], d["spread"]["bytes ratio"]
        lr = [r["params"].get("optim.lr") for r in d["rows"] if "optim.lr" in r["params"]]
        text.append(
            f"What a rerun of the search may move: {gap['n']} Propulate searches with the "
            f"same settings (`reports/search-reruns/`) chose "
            + (f"learning rates from {min(lr):.2g} to {max(lr):.2g} and " if lr else "")
            + f"gave an {d['runs'][1]} − {d['runs'][0]} gap of {gap['min']:+.2f} to "
            f"{gap['max']:+.2f} points (sd {gap['std']:.2f}) and a bytes ratio of "
            f"{ratio['min']:.3f} to {ratio['max']:.3f}. The runs train from the committed "
            f"record of one search (`results/search/{p['search']['backend']}/`), so a fresh "
            "clone's `dvc repro` gives these tables back exactly; "
            f"`dvc repro --force --downstream search@{p['search']['backend']}` reruns it."
        )
    return "\n".join(lines) + "\n\n" + " ".join(text) + "\n"


def figure(path: str, caption: str) -> list[str]:
    return [f"![{Path(path).stem}]({path})", "", f"*{caption}*", ""]


def main() -> int:
    p = params()
    REPORTS.mkdir(exist_ok=True)
    done = load_runs(p)
    missing = [n for n in runs(p) if n not in done]
    acc, t1, t2 = accuracy(done), table1(done), table2(done, p)
    write_csv(REPORTS / "table1_traffic.csv", t1)
    write_csv(REPORTS / "table2_compression.csv", t2)
    atomic_write_text(REPORTS / "runs.json", json.dumps(done, indent=2))
    write_metrics(vs_ddp(done))
    atomic_write_text(REPORTS / "curves.json", json.dumps(curves(done), indent=2))
    paper = json.loads(PAPER.read_text())
    pics = figures(done, p) if done else []
    from pipeline import plots

    rendered = {path.stem for path in plots.render()}
    search_pics, search_md = search_section(p)
    noise = seed_noise()
    gap = f" {DASH} |"

    md = [
        "# AB training: reproduction report",
        "",
        f"Generated by `dvc repro` (stage `report`, `python -m pipeline.report`) on "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.machine()}, "
        f"Python {sys.version.split()[0]}. Data: `{p['train']['data']['name']}` "
        f"({p['train']['data']['source']}); model: `{p['train']['model']['name']}`. "
        f"Do not edit: rerun the pipeline.",
        "",
        "Runs are named METHOD-NODESxRANKS[-BATCH]: `ddp` is PyTorch DDP, the baseline; `ab` "
        "is AB training with one group per node; `abng` (`ab_nogroups`) is the paper's "
        '"no groups" variant; `psgd` is DDP with PowerSGD gradient compression; `abps` '
        "(`ab_powersgd`) is AB training whose full-rank steps send PowerSGD-compressed "
        "gradients and whose syncs send each trained factor once (`only_learned`). Local "
        "batch: each rank keeps `train.batch_size`; global: "
        f"{p['experiments']['reference_global_batch']} images per step split over the ranks "
        "(`experiments` in params.yaml).",
        "",
        "## Accuracy",
        "",
        "| run | method | nodes × ranks | batch | global batch | steps | best top-1 (%) | "
        "final top-1 (%) | Δ best vs ddp | Δ final vs ddp | lowest val loss |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in acc:
        md.append(
            f"| {r['run']} | {r['method']} | {r['nodes']} × {r['ranks_per_node']} | "
            f"{r['batch']} | {r['global_batch']} | {r['steps']} | {r['best_top1']:.2f} | "
            f"{r['final_top1']:.2f} | {fmt(r['diff_best'], '+.2f')} | "
            f"{fmt(r['diff_final'], '+.2f')} | {r['min_val_loss']:.3f} |"
        )
    md += [f"| {name} |" + gap * 10 for name in missing]
    md += ["", *sum(([n, ""] for n in accuracy_notes(acc, noise)), [])]
    md += [
        "## Traffic (the paper's Table 1)",
        "",
        "Inter-node bytes each process puts on the wire, from the runs' ledgers.",
        "",
        "| run | method | nodes × ranks | batch | global batch | inter-node MB/step | "
        "bytes vs ddp | inter-node GB/s | GB/s vs ddp |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in t1:
        md.append(
            f"| {r['run']} | {r['method']} | {r['nodes']} × {r['ranks_per_node']} | "
            f"{r['batch']} | {r['global_batch']} | {r['inter_bytes_per_step'] / 1e6:.3f} | "
            f"{fmt(r['ratio_to_ddp'], '.3f')} | {r['inter_gb_per_s']:.4f} | "
            f"{fmt(r['rate_ratio_to_ddp'], '.3f')} |"
        )
    md += [f"| {name} |" + gap * 8 for name in missing]
    md += ["", *sum(([n, ""] for n in traffic_notes(done, t1)), [])]
    md += [
        "The paper (GB/s per process, A100 nodes on InfiniBand) and its AB/baseline ratio:",
        "",
        "| model | N | local: baseline | local: AB | ratio | global: baseline | global: AB "
        "| ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in paper["table1"]["rows"]:
        lr = r["local_ab"] / r["local_baseline"]
        gr = r["global_ab"] / r["global_baseline"] if r["global_baseline"] else None
        md.append(
            f"| {r['model']} | {r['N']} | {r['local_baseline']} | {r['local_ab']} | "
            f"{lr:.2f} | {fmt(r['global_baseline'])} | {fmt(r['global_ab'])} | "
            f"{fmt(gr)} |"
        )
    md += [
        "",
        "N: nodes of 4 GPUs; — : no such run in the paper (2 nodes at constant global batch).",
    ]
    ab_rows = [r for r in t1 if r["method"] == "ab" and r["rate_ratio_to_ddp"]]
    paper_ratios = [r["local_ab"] / r["local_baseline"] for r in paper["table1"]["rows"]]
    if ab_rows:

        def mean(key):
            return sum(r[key] for r in ab_rows) / len(ab_rows)

        paper_mean = sum(paper_ratios) / len(paper_ratios)
        tf = mean("time_factor")
        md += [
            "",
            "Like for like: the paper's Table 1 is GB/s per process over wall time, so its "
            "AB/baseline ratio is set beside AB's GB/s over DDP's here (the mean over the "
            f"`ab` runs): **{mean('rate_ratio_to_ddp'):.3f}** here, "
            f"**{paper_mean:.3f}** in the paper (constant local batch); difference "
            f"{mean('rate_ratio_to_ddp') - paper_mean:+.3f}.",
            "",
            "Where AB's bytes go, each part over DDP's inter-node bytes (mean over the `ab` "
            "runs), and the factor that turns the byte ratio into the GB/s ratio "
            "(DDP's wall time over AB's):",
            "",
            "| full-rank steps (warm-up, rebounds) | syncs and rank agreement | AB steps | "
            "other (setup, evaluations, checkpoints, ledger) | bytes vs ddp | × time factor "
            "| = GB/s vs ddp |",
            "|---|---|---|---|---|---|---|",
            f"| {mean('part_full_rank_steps'):.3f} | {mean('part_syncs'):.3f} | "
            f"{mean('part_ab_steps'):.3f} | {mean('part_other'):.3f} | "
            f"{mean('ratio_to_ddp'):.3f} | {tf:.3f} | "
            f"{mean('rate_ratio_to_ddp'):.3f} |",
            "",
            "The full-rank steps send what DDP sends in as many steps, so that part is about "
            "the share of steps at full rank (the schedule's); the syncs send A and B, more "
            "than W while the kept ranks stay above mn/(m+n); AB steps send nothing across "
            "nodes when the groups are nodes. The time factor is AB's own cost in wall time "
            "(SVDs, syncs, re-wrapping; `time` in each summary) on this machine, which a GPU "
            "cluster's would not share"
            + (
                f": below 1 ({tf:.3f}), AB's runs took longer than DDP's, so its GB/s ratio "
                "is lower than its byte ratio."
                if tf < 1
                else "."
            ),
        ]
    md += paper_scale_rates()
    md += [
        "",
        "## Accuracy, compression, communication reduction (the paper's Table 2)",
        "",
        "Compression: parameters of the full model over those of the trained one (A and B in "
        "place of each factorised W). ECR = 100% − F − L·c (Eq. 4, F = 25%, L = 75%, c = "
        "final size in % of full); ECR* counts the share of steps in AB phases, which send "
        "nothing across groups (our reading of the paper's asterisk); measured = 1 − "
        "inter-node bytes / ddp's.",
        "",
        "| run | method | Δ top-1 vs ddp | compression | ECR | ECR* | measured reduction |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in t2:
        md.append(
            f"| {r['run']} | {r['method']} | {fmt(r['diff_top1'], '+.2f')} | "
            f"{r['compression']:.2f}:1 | {r['ecr']:.1f}% | {fmt(r['ecr_groups'], '.1f', '%')} | "
            f"{fmt(r['measured_reduction'], '.1f', '%')} |"
        )
    md += ["", *sum(([n, ""] for n in compression_notes(t2)), [])]
    md += [
        "The paper:",
        "",
        "| setting | method | Δ top-1 | compression | ECR |",
        "|---|---|---|---|---|",
    ]
    for r in paper["table2"]["rows"]:
        md.append(
            f"| {r['setting']} | {r['method']} | {r['diff_top1']:+.2f} | "
            f"{r['compression']}:1 | {r['ecr']}% |"
        )
    md += [
        "",
        f"Measured reduction claimed by the paper: {paper['table2']['measured_reduction_claim']}.",
    ]
    if (REPORTS / "table2" / "README.md").exists():
        md += [
            "",
            "The paper's 44:1 comes from VGG16 in timm's layout trained 15,000 steps; "
            "[`table2/`](table2/README.md) runs that model at CPU scale against DDP "
            "(`bash scripts/table2.sh`), where the compression does rise above 1:1.",
        ]
    if noise is not None:
        md += [
            "",
            "## Seeds",
            "",
            f"[`seeds/`](seeds/README.md) (`python -m bench.seeds`) reruns ddp and ab at "
            f"several seeds: one method's best top-1 moves by up to {noise:.2f} points "
            "between seeds, so a single-seed Δ top-1 in the tables above smaller than that is "
            "noise; "
            "the inter-node bytes are the same at every seed.",
        ]
        md += seed_pairs(p)
    md += ["", "## Figures", ""]
    for path, caption in pics:
        md += figure(path, caption)
    curve_captions = {
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
    for name, caption in curve_captions.items():
        if name in rendered:
            md += figure(f"figures/{name}.png", caption + f" ([SVG](figures/{name}.svg))")
    md += [
        "The last two are DVC plots: `dvc plots show` draws them from `reports/curves.json` "
        "(`plots:` in dvc.yaml, template `pipeline/curves_template.json`; its page loads Vega "
        "from a CDN); `python -m pipeline.plots` renders the same charts offline to "
        "`reports/figures/` and to self-contained pages in `reports/plots/` (not committed).",
        "",
        "## Hyperparameter search: Propulate and Optuna on the same budget",
        "",
        search_md,
    ]
    for path, caption in search_pics:
        md += figure(path, caption)
    if missing:
        md += ["", f"Runs missing from this report: {', '.join(missing)}."]
    atomic_write_text(REPORTS / "README.md", "\n".join(md).rstrip() + "\n")
    atomic_write_text(HEADLINE, headline(p, acc, t1))
    print(f"[pipeline] report: {len(done)} runs, {len(missing)} missing -> {REPORTS / 'README.md'}")
    return 0


MARKS = ("<!-- headline: begin -->\n", "<!-- headline: end -->")


def copy_headline(readme: Path = Path("README.md")) -> None:
    """`python -m pipeline.report --readme`: reports/headline.md into the README."""
    text = readme.read_text()
    head, rest = text.split(MARKS[0], 1)
    _, tail = rest.split(MARKS[1], 1)
    atomic_write_text(readme, head + MARKS[0] + HEADLINE.read_text() + MARKS[1] + tail)


if __name__ == "__main__":
    if sys.argv[1:] == ["--readme"]:
        copy_headline()
        sys.exit(0)
    sys.exit(main())
