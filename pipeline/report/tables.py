"""The report's tables: the runs' results read, and the rows computed from them.

Reads results/NAME.json (each run's summary and its place in the matrix), plots/NAME.json
(its validation curve) and runs/train/NAME/config.json (its schedule, for ECR*), and every
other file the page's sections stand on (the paper's values, the planner's predictions, the
searches' bests and reruns, the seed, length and network studies), so that the modules
that write the page read none; writes the
tables as CSV, reports/metrics/NAME.json (DVC metrics: each run's inter-node bytes per step
against its ddp run's; one file per run, so `dvc metrics show` adds one column, not one per
run). Missing runs are left out here; the page leaves a gap (—) for them.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any

from abtrain import config as abconfig
from abtrain.config import BASELINE, comparison_point
from abtrain.files import atomic_write_text, read_record, write_record
from abtrain.method import schedule
from pipeline.matrix import best_config, resolve, runs
from pipeline.stage import RUNS, SEARCHES
from pipeline.train import scalars

REPORTS = Path("reports")
METRICS = REPORTS / "metrics"
RESULTS = Path("results")
PLOTS = Path("plots")
SCALE_KEYS = ("nodes", "ranks_per_node", "batch", "model", "data")


def load_runs(p: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out = {}
    for name in runs(p):
        path = RESULTS / f"{name}.json"
        if path.exists():
            out[name] = read_record(path, remake=f"dvc repro train@{name}")
    return out


def baseline(done: dict[str, dict], s: dict) -> dict | None:
    """The ddp run of the same comparison point (`abtrain.config.comparison_point`); of
    several (the paper profile's two 2-node weight decays), the one whose name ends most
    like the run's."""
    found = [o for o in done.values() if o["method"] == BASELINE and point(o) == point(s)]
    name = s["run"].get("name", "")

    def common_tail(o: dict) -> int:
        return len(os.path.commonprefix([o["run"].get("name", "")[::-1], name[::-1]]))

    return max(found, key=common_tail, default=None)


def point(s: dict) -> str:
    """A finished run's comparison point, from its result file."""
    r = s["run"]
    world = r["nodes"] * r["ranks_per_node"]
    return comparison_point(
        r["model"], r["data"], r["nodes"], r["ranks_per_node"], r["global_batch"] // world
    )


def per_step(s: dict) -> float:
    return s["traffic"]["inter_node_bytes"] / s["steps"]


def vs_ddp(done: dict[str, dict]) -> dict[str, dict[str, float]]:
    """reports/metrics/NAME.json, the one DVC metrics file of each run: its own figures (those
    of metrics/NAME.json) and, against the ddp run of the same scale and batch scheme, its
    inter-node bytes per step as a ratio (`vs_ddp`) and its best top-1 as a difference in
    points (`top1_best_vs_ddp`), so `dvc metrics show` gives one row per run (runs without
    such a ddp run are left out)."""
    out = {}
    for name, s in done.items():
        base = baseline(done, s)
        if base is not None:
            out[name] = {
                **scalars(s),
                "vs_ddp": round(per_step(s) / per_step(base), 6),
                "top1_best_vs_ddp": round(s["val_top1"]["best"] - base["val_top1"]["best"], 4),
            }
    return out


# the methods reports/headline.json gives: the paper's, its best-known peer, the two together
HEADLINE_METHODS = ("ab", "powersgd", "ab_powersgd")


def headline_metrics(done: dict[str, dict], ratios: dict[str, dict[str, float]]) -> dict:
    """reports/headline.json, the DVC metrics `dvc exp show` shows at a glance (few, with
    short names, to fit 160 columns beside the params an experiment changed): at the scale
    of the matrix's first ddp run (its batch scheme too), that run's best top-1 and, for the
    run of each of HEADLINE_METHODS there (named by its run name without the scale: ab,
    psgd, abps), its best top-1 minus ddp's in points (`_dtop1`) and its inter-node bytes
    over ddp's (`_bytes`)."""
    ref = next((n for n, s in done.items() if s["method"] == BASELINE), None)
    if ref is None:
        return {}
    scale = {k: done[ref]["run"][k] for k in ("nodes", "ranks_per_node", "batch")}
    suffix = ref[ref.find("-") :] if "-" in ref else "\0"  # ddp-2x2: "-2x2"
    out = {"ddp_top1": round(done[ref]["val_top1"]["best"], 2)}
    for name, s in done.items():
        if s["method"] not in HEADLINE_METHODS or name not in ratios:
            continue
        if any(s["run"][k] != v for k, v in scale.items()):
            continue
        short = name.removesuffix(suffix) if name.endswith(suffix) else name
        out[f"{short}_dtop1"] = round(ratios[name]["top1_best_vs_ddp"], 2)
        out[f"{short}_bytes"] = round(ratios[name]["vs_ddp"], 3)
    return out


def write_metrics(ratios: dict[str, dict[str, float]]) -> None:
    """One small metrics file per run (and none left of runs no longer in the matrix)."""
    METRICS.mkdir(parents=True, exist_ok=True)
    for stale in METRICS.glob("*.json"):
        if stale.stem not in ratios:
            stale.unlink()
    for name, m in ratios.items():
        write_record(METRICS / f"{name}.json", m)


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
                **_where(name, s),
                steps=s["steps"],
                best_top1=best,
                final_top1=final,
                diff_best=None if base is None or own else best - base["val_top1"]["best"],
                diff_final=None if base is None or own else final - base["val_top1"]["final"],
                min_val_loss=s["val_loss"]["min"],
            )
        )
    return rows


def _where(name: str, s: dict[str, Any]) -> dict[str, Any]:
    """A run's place in the matrix, the first columns of every table."""
    r = s["run"]
    return dict(
        run=name,
        method=s["method"],
        nodes=r["nodes"],
        ranks_per_node=r["ranks_per_node"],
        batch=r["batch"],
        global_batch=r["global_batch"],
    )


def table1(done: dict[str, dict]) -> list[dict[str, Any]]:
    rows = []
    for name, s in done.items():
        t, steps, secs = s["traffic"], s["steps"], s["wall_seconds"]
        base = baseline(done, s)
        rows.append(
            dict(
                **_where(name, s),
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


def run_config(p: dict, name: str) -> abconfig.Config | None:
    """The config run `name` trained with: its folder's, or, on a clone without run folders
    (they are not committed), the one the train stage resolves from params.yaml and the
    search record, which is the same while dvc.lock says the stage is up to date."""
    cfg = saved_config(RUNS / "train" / name / "config.json")
    if cfg is not None:
        return cfg
    run = runs(p).get(name)
    if run is None:  # not a run of this matrix
        return None
    try:
        return abconfig.from_dict(p["train"], [o.text for o in resolve(p, run, best_config(p))])
    except (OSError, ValueError):  # a search record or data count it cannot read
        return None


def table2(done: dict[str, dict], p: dict) -> list[dict[str, Any]]:
    rows = []
    for name, s in done.items():
        if s["method"] not in abconfig.AB_METHODS:  # nothing factorised: no compression
            continue
        base = baseline(done, s)
        cfg = run_config(p, name)  # ECR* needs its schedule
        c = s["compression_ratio"]
        rows.append(
            dict(
                run=name,
                method=s["method"],
                **top1_diff(s, base),
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


def top1_diff(s: dict, base: dict | None) -> dict[str, float | None]:
    """Best top-1 minus the ddp run's, in points (`diff_top1`); for runs trained at several
    seeds the mean of the seed-by-seed differences and their sample sd (`diff_top1_sd`)."""
    import statistics

    if base is None:
        return dict(diff_top1=None, diff_top1_sd=None)
    mine = {x["seed"]: x["val_top1"]["best"] for x in s.get("seeds", [])}
    theirs = {x["seed"]: x["val_top1"]["best"] for x in base.get("seeds", [])}
    paired = [mine[k] - theirs[k] for k in mine if k in theirs]
    if len(paired) > 1:
        return dict(diff_top1=statistics.mean(paired), diff_top1_sd=statistics.stdev(paired))
    return dict(diff_top1=s["val_top1"]["best"] - base["val_top1"]["best"], diff_top1_sd=None)


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
        own = read_record(path, shape=list) if path.exists() else []
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
    return with_label_positions(rows)


def with_label_positions(rows: list[dict[str, Any]], gap: float = 0.075) -> list[dict[str, Any]]:
    """`label_y` on each run's last row: where the template writes the run's name, right of
    its line's end, at its top-1 moved apart from its panel's other names by at least `gap`
    of the charts' top-1 range (no two overlap), each stack of names centred on the ends it
    labels, so that a name sits as near its line as the others allow."""
    tops = [r["val_top1"] for r in rows if r.get("val_top1") is not None]
    if not tops:
        return rows
    step = gap * ((max(tops) - min(tops)) or 1.0)
    last: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r.get("val_top1") is not None:
            last[r["run"]] = r
    out = [{**r, "label_y": None} for r in rows]
    ends = {id(r): i for i, r in enumerate(rows)}
    for scale in {r["scale"] for r in last.values()}:
        ranked = sorted(
            (r for r in last.values() if r["scale"] == scale), key=lambda r: r["val_top1"]
        )
        ys = spread_apart([r["val_top1"] for r in ranked], step)
        shift = max(0.0, ys[-1] - max(tops))  # the stack back down, under the charts' top
        for r, y in zip(ranked, ys):
            out[ends[id(r)]]["label_y"] = round(y - shift, 4)
    return out


def spread_apart(wanted: list[float], step: float) -> list[float]:
    """Positions for labels wanted at `wanted` (ascending), at least `step` apart: labels
    that would overlap form a stack, centred on the mean of the positions they want, and
    stacks that then overlap merge, until none does."""
    stacks = [[y] for y in wanted]  # each stack: the positions its labels want

    def placed(stack: list[float]) -> float:  # the stack's lowest label
        return sum(stack) / len(stack) - step * (len(stack) - 1) / 2

    merged = True
    while merged:
        merged = False
        for i in range(len(stacks) - 1):
            top = placed(stacks[i]) + step * (len(stacks[i]) - 1)
            if placed(stacks[i + 1]) < top + step - 1e-12:
                stacks[i : i + 2] = [stacks[i] + stacks[i + 1]]
                merged = True
                break
    return [placed(stack) + k * step for stack in stacks for k in range(len(stack))]


# ---------------------------------------------------------------- searches and seeds
def search_folders() -> list[Path]:
    """The searches that ran: runs/search/BACKEND with its evaluations."""
    return [f for f in sorted(SEARCHES.glob("*")) if (f / "evaluations.jsonl").exists()]


def search_best(folder: Path, keys: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """A search's best (FOLDER/best.json, holding `keys`), or None where it wrote none."""
    path = folder / "best.json"
    return read_record(path, keys) if path.exists() else None


RERUNS = REPORTS / "search-reruns" / "reruns.json"


def reruns() -> dict[str, Any] | None:
    """The search reruns (`python -m bench.search_reruns`), or None where there are none."""
    return read_record(RERUNS) if RERUNS.exists() else None


SEED_STUDY_SETS = ("seed=S", "tracking.enabled=false")  # every study's (bench.seeds)
# what a study's file made before its command recorded the model was trained with
EARLIER_MODEL_WHAT = "abtrain's own ViT, before the models were timm's"
EARLIER_MODEL = f"the earlier model ({EARLIER_MODEL_WHAT})"


def same_model(data: dict[str, Any], p: dict[str, Any]) -> bool:
    """Whether a study's file (seeds.json, reruns.json, network-*.json) was made with the
    matrix's model: the `model` its command recorded (a file without one predates it)."""
    return data.get("model") == p["train"]["model"]


def search_record(p: dict[str, Any]) -> dict[str, Any] | None:
    """The committed search record the matrix trains from (results/search/BACKEND/best.json),
    or None where the runs take no search values or there is no record."""
    path = SEARCHES / p["search"]["backend"] / "best.json"
    return read_record(path) if p["search"]["use_best"] and path.exists() else None


def lengths_study(p: dict[str, Any]) -> dict[str, Any] | None:
    """The training-length study (reports/lengths/lengths.json, `python -m bench.lengths`)
    when it was made with the matrix's model, else None."""
    path = REPORTS / "lengths" / "lengths.json"
    data = read_record(path) if path.exists() else None
    return data if data and same_model(data, p) else None


def tradeoff_study(p: dict[str, Any]) -> dict[str, Any] | None:
    """The trade-off study (reports/tradeoff/points.json, `python -m bench.tradeoff`) when
    it was made with the matrix's model, else None."""
    path = REPORTS / "tradeoff" / "points.json"
    data = read_record(path) if path.exists() else None
    return data if data and same_model(data, p) else None


def seed_studies(p: dict[str, Any]) -> list[dict[str, Any]]:
    """Every seed study here (reports/seeds*/seeds.json, `python -m bench.seeds`), each with
    `folder`, `data` (its seeds.json), `extra` (overrides beyond the seed's), `searched`
    (trained with search values), `same_values` (with the values the matrix trains: the
    committed record's, compared value by value, or none where the matrix takes none) and
    `same_model` (made with the matrix's model) and `matches` (same values and model, no
    extra override: the configuration of the report's runs). A study that names no values
    (`search_best`) can't be checked, so it does not match."""
    record = search_record(p)
    out = []
    for path in sorted(REPORTS.glob("seeds*/seeds.json")):
        data = read_record(path)
        extra = [x for x in data.get("overrides_extra", []) if x not in SEED_STUDY_SETS]
        searched = bool(data.get("search_best_values"))
        same = (
            record is not None and data.get("search_best") == record["params"]
            if searched
            else record is None
        )
        out.append(
            dict(
                folder=path.parent.name,
                data=data,
                extra=extra,
                searched=searched,
                same_values=same,
                same_model=same_model(data, p),
                matches=same and not extra and same_model(data, p),
            )
        )
    return out


def study_difference(study: dict[str, Any]) -> dict[str, Any] | None:
    """A study's paired difference in best top-1 (compared − baseline, percentage points):
    `of`, `baseline`, `compared`, `per_seed` {seed: Δ}, `mean`, `sd` (sample standard
    deviation), `n`, and `noise`: the largest range of one method's best top-1 over the
    seeds. None where the study has fewer than two seeds of the pair."""
    data = study["data"]
    summary = data.get("summary", {})
    d = summary.get("difference") or {}
    sp = d.get("spread")
    if not sp or sp.get("std") is None:
        return None
    ranges = [m["best_top1"]["range"] for m in summary.get("methods", {}).values()]
    return dict(
        of=d["of"],
        baseline=data["baseline"],
        compared=data["compared"],
        per_seed=d["per_seed"],
        mean=sp["mean"],
        sd=sp["std"],
        n=sp["n"],
        noise=max(ranges) if ranges else None,
    )


# ---------------------------------------------------------------- time to accuracy
NETWORK_RATES = Path("bench/results/network-rates.json")


def made_like_the_matrix(p: dict[str, Any], run: dict[str, Any]) -> bool:
    """Whether a bench.network per-rate file's runs were made with the values the matrix's
    runs of their methods train with now (bench.network's default), measurement aside."""
    from pipeline.matrix import BENCHMARK_SETS, last_of_each_key, matrix_sets

    try:
        methods = [r["method"] for r in run["results"]]
        shared, own = matrix_sets(p, run["nodes"], run["ranks_per_node"], methods)
    except (SystemExit, abconfig.ConfigError, ValueError, KeyError, OSError):
        return False  # no such run in the matrix, or no search record to resolve it
    want = last_of_each_key([*shared, *BENCHMARK_SETS])
    return run.get("overrides") == want and (run.get("method_overrides") or {}) == own


def first_to_target(
    path: Path | None = None, p: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Which method reaches the target accuracy first, over link rates, per shape of the
    emulated-cluster benchmark (`python -m bench.rates`; [] where it has not run).

    Each shape: `nodes`, `ranks_per_node`, `target_top1`, `steps` (the benchmark's run
    length, from its per-rate files' overrides, or None), `matrix_values` (given the params
    `p`: every per-rate file made with the matrix's runs' values), `grid` (the lowest and highest
    rate of its time model, Mbit/s), `leads` (one {method, lo, hi} per span of rates where
    the model has that method first, its ends at the crossovers between the two leaders),
    `unshaped` (first on the unshaped link) and `measured` (per measured rate: the measured
    fastest and the model's)."""
    path = path or NETWORK_RATES
    if not path.exists():
        return []
    data = read_record(path)
    steps, model, like = None, None, p is not None
    for other in sorted(path.parent.glob("network-*.json")):
        if other == path:
            continue
        run = read_record(other)
        model = model or run.get("model")
        like = like and made_like_the_matrix(p, run)
        sets = run.get("overrides", [])
        found = [int(x.split("=", 1)[1]) for x in sets if x.startswith("steps=")]
        if found and steps is None:
            steps = found[0]
    out = []
    for s in data["shapes"]:
        curves = s["model_curves"]
        if not curves:
            continue
        methods = sorted(curves)
        shaped = {m: [(x, t) for x, t in curves[m] if x is not None] for m in methods}
        grid = [x for x, _ in shaped[methods[0]]]
        leads: list[dict[str, Any]] = []
        for i, x in enumerate(grid):
            m = min(methods, key=lambda m: shaped[m][i][1])
            if leads and leads[-1]["method"] == m:
                leads[-1]["hi"] = x
                continue
            if leads:  # the two leaders cross between this point and the last
                a, lo = leads[-1]["method"], grid[i - 1]
                at = next(
                    (
                        c["mbit_per_s"]
                        for c in s["crossovers"]
                        if set(c["methods"]) == {a, m} and lo <= c["mbit_per_s"] <= x
                    ),
                    (lo * x) ** 0.5,
                )
                leads[-1]["hi"] = at
                leads.append(dict(method=m, lo=at, hi=x))
            else:
                leads.append(dict(method=m, lo=x, hi=x))
        free = {m: next(t for x, t in curves[m] if x is None) for m in methods}
        out.append(
            dict(
                nodes=s["nodes"],
                ranks_per_node=s["ranks_per_node"],
                target_top1=s["target_top1"],
                steps=steps,
                matrix_values=like,  # made with the matrix's runs' values (given `p`)
                model=model,  # the model its runs trained (None: recorded before timm's)
                methods=methods,
                grid=(grid[0], grid[-1]),
                leads=leads,
                unshaped=min(free, key=free.get),
                measured=[
                    dict(
                        rate=r["rate"],
                        fastest=r["fastest"],
                        model=r["predicted_fastest"],
                        seconds={
                            x["method"]: x["seconds_to_target"]
                            for x in r.get("methods", [])
                            if x.get("seconds_to_target") is not None
                        },
                    )
                    for r in s["rates"]
                ],
                # AB against DDP alone, the paper's only baseline: the rate below which
                # the time model has AB first of the two (None: no crossing in the grid)
                ab_ahead_of_ddp_below=next(
                    (
                        c["mbit_per_s"]
                        for c in s.get("crossovers", [])
                        if set(c["methods"]) == {"ab", "ddp"} and c["faster_below"] == "ab"
                    ),
                    None,
                ),
            )
        )
    return out


# ---------------------------------------------------------------- the paper and the planner
PAPER = Path("pipeline/paper_reference.json")
PAPER_SCALE = Path("bench/results/paper_scale.json")


def paper_reference() -> dict[str, Any]:
    """The paper's published values (pipeline/paper_reference.json)."""
    return read_record(PAPER)


def paper_scale() -> dict[str, Any] | None:
    """The prediction at the paper's scale (`python -m bench.paper_scale`), or None
    where it has not run."""
    return read_record(PAPER_SCALE) if PAPER_SCALE.exists() else None


def table2_study() -> bool:
    """Whether the Table 2 study (`bash scripts/table2.sh`) wrote its page under reports/."""
    return (REPORTS / "table2" / "README.md").exists()
