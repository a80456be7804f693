"""Time to accuracy over link rates, measured on the emulated cluster and predicted by the
planner's time model: which method pays off at which rate, and where one overtakes another.

    python -m bench.rates    # from the committed bench/results/network-*.json (no training):
                             # writes bench/results/network-rates.json and network-rates.png

A study of the skeleton (bench.study) that trains nothing: its record is the per-rate files,
and `python -m bench.network` is the same study with the runs that make them. Runs made with other overrides (each
per-rate file records its `--set` and `--method-set` values) are not one table: it refuses
them, naming the files and the overrides that differ, unless `--by-overrides` asks for one
table per set of overrides (written beside, as network-rates-by-overrides.json and .png).

Target accuracy, per cluster shape (nodes x ranks per node): each run's top-1 is smoothed
over 2 consecutive evaluations (their mean, placed at their mid step and mid time, so that
runs evaluated at different intervals are not delayed by different amounts); the target is
the lowest of the runs' best smoothed top-1, so that every method reaches it. Time (and
step) to target: where the smoothed curve first reaches the target, interpolated linearly
between the two smoothed points around it.

Prediction, for each method, rate and shape: the unshaped run's training seconds at the
target step (interpolated over its evaluations: its evaluations, syncs and phase changes
included) plus the time the link adds to the steps and syncs before that step (the planner's
plan of the run cut at that step, `timing` over the link minus `timing` with no network
cost). The target step comes from the shape's unshaped run, or from the run itself where the
shape has none (training is deterministic in the link: the same steps reach the same
accuracy at every rate). Compute per phase: the unshaped run of the same shape, else that of
another shape with the same world size (the same ranks share this machine's cores).
Crossovers: where two methods' predicted times to target are equal, found by bisection on
the model between 20 Mbit/s and 10 Gbit/s; each names the measured rates at which the two
methods' measured order is not the model's (`contradicted_by`; drawn hollow).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import yaml

from abtrain import config as abconfig
from abtrain.files import read_record
from abtrain.predict import MODEL_ERROR
from abtrain.predict.timing import ToTarget
from bench import study
from bench.paper_scale import measured_mean, rate_bytes_per_s
from pipeline.stage import parser, stage

RESULTS = Path("bench/results")
BASE_SHAPE = (2, 2)  # its per-rate files keep the plain name network-<rate>.json
SUMMARY = "network-rates"
CLASSES = 10  # CIFAR-10, for results files that don't record it (older, or no prepared data)
GRID = (20e6 / 8, 10e9 / 8)  # bytes/s: the rates the model's curves and crossovers span
SMOOTH = 2  # evaluations averaged
RULES = dict(
    target="per shape: the lowest, over its runs, of each run's best top-1 smoothed over 2 "
    "consecutive evaluations (their mean at their mid step and mid time)",
    time_to_target="first reach of the target by the smoothed curve, interpolated linearly "
    "between the smoothed points around it",
    prediction="the unshaped run's training seconds at the target step plus the time the "
    "planner's time model adds over the link to the steps and syncs before it",
    crossovers="from the time model (bisection between 20 Mbit/s and 10 Gbit/s), not from "
    "the measured points; contradicted_by: the measured rates at which the two methods' "
    "measured order is not the model's",
)


def result_name(nodes: int, ranks_per_node: int, rate: str | None) -> str:
    """network-<rate> for 2 nodes x 2 ranks; the nodes (and ranks, when not 1) otherwise:
    network-4n-200mbit, network-4n2r-200mbit."""
    rate = rate or "unshaped"
    if (nodes, ranks_per_node) == BASE_SHAPE:
        return f"network-{rate}"
    ranks = f"{ranks_per_node}r" if ranks_per_node != 1 else ""
    return f"network-{nodes}n{ranks}-{rate}"


def load(results: Path = RESULTS) -> list[dict[str, Any]]:
    """Every per-rate results file bench.network wrote (not the summary), with its name
    under `file`."""
    out = []
    for f in sorted(results.glob("network-*.json")):
        d = read_record(f)
        if isinstance(d, dict) and isinstance(d.get("results"), list):
            out.append({**d, "file": f.name})
    return out


class MixedOverrides(ValueError):
    """Per-rate files whose runs were made with different overrides."""


def normalised(sets: list[str], where: str) -> dict[str, Any]:
    """KEY=VALUE overrides as {dotted key: value read as YAML}, the last of a key winning:
    the same settings compare equal however they were spelled or ordered."""
    out: dict[str, Any] = {}
    for text in sets:
        try:
            path, value = abconfig.parse_override(text)
        except abconfig.ConfigError as err:
            raise ValueError(f"{where}: {err}") from None
        out[".".join(path)] = value
    return out


def settings(d: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, dict[str, Any]]]:
    """What a per-rate file's runs were made with: its `overrides` (None where the file
    does not record them: nothing to match them with) and, for each method it ran, that
    method's own (`method_overrides`)."""
    where = d.get("file", "a results file")
    general = normalised(d["overrides"], where) if "overrides" in d else None
    own = d.get("method_overrides") or {}
    return general, {r["method"]: normalised(own.get(r["method"], []), where) for r in d["results"]}


def compatible(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """The same overrides, and the same own overrides for every method both ran."""
    (ga, oa), (gb, ob) = settings(a), settings(b)
    return ga == gb and all(oa[m] == ob[m] for m in oa.keys() & ob.keys())


def groups(files: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The files in groups of compatible overrides, in file order."""
    out: list[list[dict[str, Any]]] = []
    for d in files:
        home = next((g for g in out if all(compatible(d, x) for x in g)), None)
        if home is None:
            out.append([d])
        else:
            home.append(d)
    return out


def made_with(part: list[dict[str, Any]]) -> str:
    """A group's overrides as a line: `--set` values, then each method's own."""
    general = part[0].get("overrides")
    text = " ".join(general) if general else "(none)" if general is not None else "not recorded"
    own: dict[str, list[str]] = {}
    for d in part:
        for r in d["results"]:
            sets = (d.get("method_overrides") or {}).get(r["method"])
            if sets:
                own[r["method"]] = sets
    return text + "".join(f"; {m} only: {' '.join(v)}" for m, v in sorted(own.items()))


def differing(parts: list[list[dict[str, Any]]]) -> list[str]:
    """The override keys (METHOD:KEY for a method's own) whose values differ between
    groups, or that some group did not record."""
    seen = [settings(d) for part in parts for d in part]
    if any(g is None for g, _ in seen):
        return ["(overrides not recorded in some files)"]
    keys = {k for g, _ in seen for k in g} | {f"{m}:{k}" for _, o in seen for m in o for k in o[m]}
    out = []
    for key in sorted(keys):
        method, _, name = key.rpartition(":")
        values = {
            json.dumps(o[method].get(name) if method else g.get(key), sort_keys=True)
            for g, o in seen
            if not method or method in o
        }
        if len(values) > 1:
            out.append(key)
    return out


def mixed_message(parts: list[list[dict[str, Any]]], results: Path) -> str:
    lines = [f"{results}: these runs were made with different overrides; not one table:"]
    for part in parts:
        lines.append(f"  {', '.join(d['file'] for d in part)}: {made_with(part)}")
    lines.append(f"  differing: {', '.join(differing(parts)) or '(see above)'}")
    lines.append(
        "Rerun them with the same --set and --method-set values, move the others out of "
        f"{results}, or pass --by-overrides for one table per set of overrides."
    )
    return "\n".join(lines)


def smoothed(evals: list[dict[str, Any]], n: int = SMOOTH) -> list[tuple[float, float, float]]:
    """(step, seconds, top-1) of the means of `n` consecutive evaluations, each at its
    window's mean step and time; a run with fewer evaluations keeps them as they are."""
    pts = [(float(e["step"]), float(e["seconds"]), float(e["val_top1"])) for e in evals]
    if len(pts) < n:
        return pts
    return [
        tuple(sum(p[i] for p in pts[k : k + n]) / n for i in range(3))  # type: ignore[misc]
        for k in range(len(pts) - n + 1)
    ]


def best(evals: list[dict[str, Any]]) -> float:
    return max(p[2] for p in smoothed(evals))


def reach(evals: list[dict[str, Any]], target: float) -> dict[str, float] | None:
    """Step and seconds at which the smoothed curve first reaches `target`, interpolated."""
    pts = smoothed(evals)
    for k, (step, seconds, top1) in enumerate(pts):
        if top1 >= target:
            if k == 0:
                return dict(step=step, seconds=seconds)
            s0, t0, a0 = pts[k - 1]
            f = (target - a0) / (top1 - a0)
            return dict(step=s0 + f * (step - s0), seconds=t0 + f * (seconds - t0))
    return None


def _cfg(params: dict, bench: dict, method: str) -> abconfig.Config:
    sets = [
        f"method={method}",
        *bench.get("overrides", []),
        *bench.get("method_overrides", {}).get(method, []),
    ]
    return abconfig.from_dict(params["train"], sets)


def time_model(params: dict, bench: dict, free: dict, method: str, target_step: float) -> ToTarget:
    """One method's time to target at one shape, for any link (abtrain.predict.timing.ToTarget)."""
    classes = bench.get("classes") or CLASSES  # None: written where data wasn't prepared
    cfg = _cfg(params, bench, method)
    return ToTarget(cfg, bench["nodes"], bench["ranks_per_node"], classes, free, target_step)


def _crossings(models: dict[str, ToTarget]) -> list[dict[str, Any]]:
    grid = [GRID[0] * (GRID[1] / GRID[0]) ** (i / 200) for i in range(201)]
    out = []
    names = sorted(models)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:

            def gap(x: float, a: str = a, b: str = b) -> float:
                return models[a].seconds(x) - models[b].seconds(x)

            for lo, hi in zip(grid, grid[1:]):
                if gap(lo) * gap(hi) >= 0:
                    continue
                for _ in range(40):
                    mid = math.sqrt(lo * hi)
                    lo, hi = (mid, hi) if gap(lo) * gap(mid) > 0 else (lo, mid)
                link = math.sqrt(lo * hi)
                slow_link_winner = a if gap(lo * 0.999) < 0 else b
                out.append(
                    dict(
                        methods=[a, b],
                        mbit_per_s=link * 8 / 1e6,
                        link_bytes_per_s=link,
                        seconds_to_target=models[a].seconds(link),
                        faster_below=slow_link_winner,
                        faster_above=b if slow_link_winner == a else a,
                    )
                )
    return sorted(out, key=lambda c: c["link_bytes_per_s"])


def contradicted(pair: list[str], rates: list[dict[str, Any]]) -> list[str]:
    """The measured rates at which the pair's measured order to the target is not the
    model's, by more than the model's error (abtrain.commands.plan.MODEL_ERROR: two methods measured
    closer than that are a tie the model need not order): a crossover of the pair drawn
    there would claim what was measured otherwise."""
    a, b = pair
    out = []
    for r in rates:
        rows = {x["method"]: x for x in r["methods"]}
        if a not in rows or b not in rows:
            continue
        x, y = rows[a], rows[b]
        times = (x["seconds_to_target"], y["seconds_to_target"])
        model = (x["predicted_seconds_to_target"], y["predicted_seconds_to_target"])
        if None in times or None in model:
            continue
        apart = max(times) / min(times) - 1 > MODEL_ERROR
        if apart and (times[0] < times[1]) != (model[0] < model[1]):
            out.append(r["rate"])
    return out


def analyse(params: dict, files: list[dict[str, Any]]) -> dict[str, Any]:
    """Measured and predicted time to target of every method at every rate and shape."""
    shapes: dict[tuple[int, int], list[dict]] = {}
    for d in files:
        shapes.setdefault((d["nodes"], d["ranks_per_node"]), []).append(d)
    unshaped = {k: next((d for d in v if d["rate"] == "unshaped"), None) for k, v in shapes.items()}
    out_shapes, check = [], []
    for (nodes, ranks), benches in sorted(shapes.items()):
        shape = shape_summary(params, nodes, ranks, benches, unshaped)
        out_shapes.append(shape)
        check += [row for r in shape["rates"] for row in check_rows(nodes, ranks, r)]
    return dict(rules=RULES, shapes=out_shapes, check=check)


def shape_summary(
    params: dict,
    nodes: int,
    ranks: int,
    benches: list[dict[str, Any]],
    unshaped: dict[tuple[int, int], dict | None],
) -> dict[str, Any]:
    """One shape: its target (the lowest best of its runs), each rate's times, the time
    model's crossovers and curves. The model's compute comes from the shape's unshaped runs
    (else another shape's of the same world size)."""
    world = nodes * ranks
    free_bench = unshaped[(nodes, ranks)] or next(
        (u for (n, r), u in unshaped.items() if u and n * r == world), None
    )
    free = {r["method"]: r for r in free_bench["results"]} if free_bench else {}
    target = min(best(r["evals"]) for d in benches for r in d["results"])
    own_free = unshaped[(nodes, ranks)]
    steps_from = {r["method"]: r for r in own_free["results"]} if own_free else {}
    models: dict[str, ToTarget] = {}
    rates = [
        rate_summary(params, d, target, free, steps_from, models)
        for d in sorted(benches, key=lambda d: -(rate_bytes_per_s(d["rate"]) or math.inf))
    ]
    return dict(
        nodes=nodes,
        ranks_per_node=ranks,
        target_top1=target,
        compute_from=f"{free_bench['nodes']}x{free_bench['ranks_per_node']} unshaped"
        if free_bench
        else None,
        rates=rates,
        crossovers=[
            {**c, "contradicted_by": contradicted(c["methods"], rates)} for c in _crossings(models)
        ],
        model_curves={m: model_curve(mod) for m, mod in models.items()},
    )


def rate_summary(
    params: dict,
    d: dict[str, Any],
    target: float,
    free: dict[str, dict],
    steps_from: dict[str, dict],
    models: dict[str, ToTarget],
) -> dict[str, Any]:
    """One rate of a shape: each method's measured and predicted times to the target, the
    fastest measured and the model's pick. `models` gains each method's time model."""
    link = rate_bytes_per_s(d["rate"])
    rows = []
    for r in d["results"]:
        m = r["method"]
        got = reach(r["evals"], target)
        row = dict(
            method=m,
            best_smoothed_top1=best(r["evals"]),
            steps_to_target=got and got["step"],
            seconds_to_target=got and got["seconds"],
            wall_seconds=r["wall_seconds"],
            measured_step_seconds=None,
            predicted_step_seconds=None,
            predicted_seconds_to_target=None,
        )
        step = reach(steps_from.get(m, r)["evals"], target)
        if m in free and step:
            if m not in models:
                models[m] = time_model(params, d, free[m], m, step["step"])
            model = models[m]
            row["measured_step_seconds"] = measured_mean(model.full, r["step_seconds"])
            row["predicted_step_seconds"] = model.step_seconds(link)
            row["step_error"] = row["predicted_step_seconds"] / row["measured_step_seconds"] - 1
            row["predicted_seconds_to_target"] = model.seconds(link)
        rows.append(row)
    reached = [x for x in rows if x["seconds_to_target"] is not None]
    fastest = min(reached, key=lambda x: x["seconds_to_target"])["method"]
    predicted = [x for x in rows if x["predicted_seconds_to_target"] is not None]
    guess = (
        min(predicted, key=lambda x: x["predicted_seconds_to_target"])["method"]
        if predicted
        else None
    )
    ordered = sorted(x["seconds_to_target"] for x in reached)
    return dict(
        rate=d["rate"],
        link_bytes_per_s=link,
        methods=rows,
        fastest=fastest,
        predicted_fastest=guess,
        fastest_margin=ordered[1] / ordered[0] - 1 if len(ordered) > 1 else None,
    )


def check_rows(nodes: int, ranks: int, rate: dict[str, Any]) -> list[dict[str, Any]]:
    """The time model against the measurement at one rate, a row per method it predicts.
    The model's pick is right if it was first, or measured within the model's error of the
    first (a tie it need not break)."""
    fastest, guess = rate["fastest"], rate["predicted_fastest"]
    took = {x["method"]: x["seconds_to_target"] for x in rate["methods"]}
    took = {m: s for m, s in took.items() if s is not None}
    matches = guess == fastest or (guess in took and took[guess] / took[fastest] - 1 < MODEL_ERROR)
    return [
        dict(
            nodes=nodes,
            ranks_per_node=ranks,
            rate=rate["rate"],
            method=x["method"],
            measured_step_seconds=x["measured_step_seconds"],
            predicted_step_seconds=x["predicted_step_seconds"],
            step_error=x["step_error"],
            seconds_to_target=x["seconds_to_target"],
            predicted_seconds_to_target=x["predicted_seconds_to_target"],
            fastest=fastest,
            predicted_fastest=guess,
            recommendation_matches=matches,
        )
        for x in rate["methods"]
        if x["predicted_step_seconds"] is not None
    ]


def model_curve(model: ToTarget) -> list[tuple[float | None, float]]:
    """The time model's seconds to the target over the grid of link rates (Mbit/s), and
    unshaped (None) last."""
    rates = (GRID[0] * (GRID[1] / GRID[0]) ** (i / 60) for i in range(61))
    return [(x * 8 / 1e6, model.seconds(x)) for x in rates] + [(None, model.seconds(None))]


def summarise(
    params: dict, results: Path = RESULTS, by_overrides: bool = False
) -> dict[str, Any] | None:
    """Every per-rate file under `results` analysed (None: there is none). Files made with
    different overrides: MixedOverrides, or with `by_overrides` one table per set of them,
    each shape labelled with its set."""
    files = load(results)
    if not files:
        return None
    parts = groups(files)
    if len(parts) > 1 and not by_overrides:
        raise MixedOverrides(mixed_message(parts, results))
    summary: dict[str, Any] = dict(rules=RULES, shapes=[], check=[])
    for k, part in enumerate(parts, 1):
        label = f"settings {k}" if len(parts) > 1 else None
        got = analyse(params, part)
        for shape in got["shapes"]:
            mine = [d for d in part if (d["nodes"], d["ranks_per_node"]) == shape_of(shape)]
            shape["settings"] = dict(label=label, made_with=made_with(mine), files=file_names(mine))
        for c in got["check"]:
            c["settings"] = label
        summary["shapes"] += got["shapes"]
        summary["check"] += got["check"]
    return summary


def shape_of(shape: dict[str, Any]) -> tuple[int, int]:
    return shape["nodes"], shape["ranks_per_node"]


def file_names(files: list[dict[str, Any]]) -> list[str]:
    return [d["file"] for d in files if "file" in d]


def plot(summary: dict[str, Any], path: Path) -> None:
    """One panel per shape: each method's predicted time to target over the link (line)
    and its measured ones (points), in its colour and marker of pipeline.style; the
    crossovers numbered, listed under the panel; one legend, outside the panels."""
    from pipeline import style

    shapes = summary["shapes"]
    methods = style.ordered(
        [m for shape in shapes for m in shape["model_curves"]]
        + [row["method"] for shape in shapes for r in shape["rates"] for row in r["methods"]]
    )
    free_x = 40e3  # where the unshaped link sits on the Mbit/s axis
    with style.matplotlib_defaults() as plt:
        fig, axes = plt.subplots(
            1, len(shapes), figsize=(7 * len(shapes) + 2, 5.6), squeeze=False, layout="constrained"
        )
        for ax, shape in zip(axes[0], shapes):
            for m in style.ordered(shape["model_curves"]):
                curve = shape["model_curves"][m]
                xs = [free_x if x is None else x for x, _ in curve]
                c, z = style.colour(m), 2 + 0.1 * style.rank(m)
                ax.plot(xs[:-1], [y for _, y in curve[:-1]], lw=1.5, color=c, zorder=z)
                ax.plot(xs[-2:], [y for _, y in curve[-2:]], lw=1, ls=":", color=c, zorder=z)
            for r in shape["rates"]:
                x = r["link_bytes_per_s"] * 8 / 1e6 if r["link_bytes_per_s"] else free_x
                for row in r["methods"]:
                    if row["seconds_to_target"] is None:
                        continue
                    dot = style.marker(row["method"], filled=False)  # outlines: all seen
                    dot["zorder"] += 2  # over every line
                    ax.plot(x, row["seconds_to_target"], ls="", **dot)
            # numbered markers, listed under the panel: labels beside close crossovers
            # would overlap, and a list inside the panel could cover points
            listed = []
            for k, c in enumerate(shape["crossovers"], 1):
                y = c["seconds_to_target"]
                against = c.get("contradicted_by")
                # hollow: the measured points order the two methods otherwise
                fill = "none" if against else "black"
                ax.plot(c["mbit_per_s"], y, "X", color="black", mfc=fill, ms=8, zorder=5)
                ax.annotate(
                    str(k),
                    (c["mbit_per_s"], y),
                    xytext=(4, 4),
                    textcoords="offset points",
                    fontsize=8,
                    fontweight="bold",
                    zorder=6,
                )
                listed.append(
                    f"{k}: {c['mbit_per_s']:.0f} Mbit/s, {c['faster_below']} faster below, "
                    f"{c['faster_above']} above"
                    + (f"; measured otherwise at {', '.join(against)}" if against else "")
                )
            ticks = [20, 50, 200, 1000, 10_000, free_x]
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xticks(ticks, ["20M", "50M", "200M", "1G", "10G", "unshaped"])
            ax.minorticks_off()
            lo, hi = ax.get_ylim()
            yt = [v for v in (10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000) if lo <= v <= hi]
            ax.set_yticks(yt, [str(v) for v in yt])
            ax.axvline(20e3, color="grey", lw=0.8, ls="--", zorder=1)  # the axis breaks
            label = (shape.get("settings") or {}).get("label")
            ax.set(
                title=f"{shape['nodes']} nodes x {shape['ranks_per_node']} "
                f"rank{'s' * (shape['ranks_per_node'] > 1)}: time to "
                f"{shape['target_top1']:.2f}% top-1 (smoothed)" + (f"\n{label}" if label else ""),
                xlabel="link per node, each way (bit/s)",
                ylabel="seconds to target (log)",
            )
            if listed:  # under the axis label, left-aligned with the panel
                ax.annotate(
                    "crossovers (model):\n" + "\n".join(listed),
                    (0, 0),
                    xycoords=("axes fraction", ax.xaxis.label),
                    xytext=(0, -8),
                    textcoords="offset points",
                    fontsize=8,
                    va="top",
                )
            ax.grid(alpha=0.3, which="both")
        handles = style.handles(methods, filled=False)
        label = "crossover (model)"
        handles.append(plt.Line2D([], [], color="black", marker="X", ls="", label=label))
        if any(c.get("contradicted_by") for shape in shapes for c in shape["crossovers"]):
            label = "crossover the measured\npoints contradict"
            handles.append(
                plt.Line2D([], [], color="black", marker="X", mfc="none", ls="", label=label)
            )
        fig.legend(
            handles=handles,
            fontsize=8,
            loc="outside right upper",
            title="points: measured\nlines: model",
            title_fontsize=8,
        )
        style.save(fig, path, dpi=110)


def summary_text(summary: dict[str, Any]) -> str:
    """The summary as the command prints it: per shape, each rate's methods measured and
    predicted, the fastest, the crossovers."""
    lines: list[str] = []
    for shape in summary["shapes"]:
        lines.append(
            f"\n{shape['nodes']} nodes x {shape['ranks_per_node']} ranks: target top-1 "
            f"{shape['target_top1']:.2f}% (smoothed over {SMOOTH} evaluations)"
        )
        made = shape.get("settings")
        if made:
            label = f"{made['label']}, " if made["label"] else ""
            lines.append(f"{label}made with: {made['made_with']}")
        lines.append(
            f"{'rate':<10}{'method':<13}{'steps':>7}{'s to target':>12}{'predicted':>10}"
            f"{'s/step':>8}{'pred.':>8}{'err':>7}"
        )
        for r in shape["rates"]:
            for x in r["methods"]:
                cells = [
                    x["steps_to_target"],
                    x["seconds_to_target"],
                    x["predicted_seconds_to_target"],
                    x["measured_step_seconds"],
                    x["predicted_step_seconds"],
                ]
                f = [f"{v:.1f}" if v is not None else "—" for v in cells[:3]]
                f += [f"{v:.3f}" if v is not None else "—" for v in cells[3:]]
                err = f"{x['step_error']:+.1%}" if x.get("step_error") is not None else "—"
                lines.append(
                    f"{r['rate']:<10}{x['method']:<13}{f[0]:>7}{f[1]:>12}{f[2]:>10}{f[3]:>8}"
                    f"{f[4]:>8}{err:>7}"
                )
            lines.append(
                f"{'':<10}fastest: {r['fastest']} (measured), {r['predicted_fastest']} (predicted)"
            )
        for c in shape["crossovers"]:
            against = c.get("contradicted_by")
            lines.append(
                f"crossover at {c['mbit_per_s']:.0f} Mbit/s: {c['faster_below']} faster below, "
                f"{c['faster_above']} above"
                + (f" (the measured order disagrees at {', '.join(against)})" if against else "")
            )
    return "\n".join(lines)


# ---------------------------------------------------------------- python -m bench.rates
@dataclass
class Rates(study.Study):
    """The summary of the per-rate files in `out` (bench.network's), its figure beside it:
    a study that trains nothing. bench.network is this study with its runs."""

    config: Path = Path("params.yaml")

    name: ClassVar[str] = "rates"
    record: ClassVar[str] = f"{SUMMARY}.json"
    figure_file: ClassVar[str | None] = f"{SUMMARY}.png"
    page_file: ClassVar[str | None] = None  # the report's benchmark section is its page
    separate: ClassVar[bool] = False  # runs of other overrides: one table each, or refused

    def summary(self) -> dict[str, Any]:
        summary = summarise(yaml.safe_load(Path(self.config).read_text()), self.out, self.separate)
        if summary is None:
            raise SystemExit(f"no {self.out}/network-*.json: run python -m bench.network first")
        return summary

    def recorded(self) -> dict[str, Any]:
        return self.summary()  # the per-rate files are its record

    def aggregate(self, runs: list[study.Run]) -> dict[str, Any]:
        return self.summary()

    def figure(self, data: dict[str, Any], path: Path) -> None:
        plot(data, path)

    def closing(self, data: dict[str, Any]) -> str:
        return summary_text(data)


@dataclass
class ByOverrides(Rates):
    """Runs of other overrides side by side, one labelled table each, written beside."""

    record: ClassVar[str] = f"{SUMMARY}-by-overrides.json"
    figure_file: ClassVar[str | None] = f"{SUMMARY}-by-overrides.png"
    separate: ClassVar[bool] = True


def main(argv: list[str] | None = None) -> int:
    p = parser("bench.rates", __doc__)
    p.add_argument("--config", type=Path, default=Path("params.yaml"))
    p.add_argument(
        "--out",
        "--results",
        type=Path,
        default=RESULTS,
        help="where the network-*.json files are; the summary and its figure go there",
    )
    p.add_argument(
        "--by-overrides",
        action="store_true",
        help="files made with different --set/--method-set values: one table per set of "
        f"them, labelled, written as {SUMMARY}-by-overrides.json and .png, instead of refusing",
    )
    a = p.parse_args(argv)
    made = (ByOverrides if a.by_overrides else Rates)(out=a.out, config=a.config)
    try:
        return study.conduct(made, argparse.Namespace(render=True))
    except MixedOverrides as err:
        print(f"bench.rates: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(stage(main, who="bench"))
