"""Benchmark on an emulated cluster: every method on the same model, data and seed, over
real links of chosen speeds; traffic counted at the interfaces and by the ledger; time to a
common accuracy at each rate, measured and predicted (bench.rates).

    sudo-less as root here (--dry-run predicts its wall time):
    python -m bench.network --shape 2x2=50mbit,200mbit,1gbit,none --shape 4x1=200mbit

Every run trains as the matrix's run of its method at the same world size trains
(`experiments.runs` resolved by pipeline.common: steps, batch, the search's best values, the
schedule's fractions, the run's own `set`), so the verdict's time to target and its top-1
columns come from one configuration; only what the benchmark measures differs (BENCHMARK_SETS:
an evaluation every 10 steps to time the target, no checkpoints in the timed loop).
`--no-matrix` takes `train` as params.yaml gives it instead. `--set` and `--method-set` add
to them or change them, and each per-rate file records the values its runs were made with
(bench.rates will not put runs made with different ones in one table).

Writes bench/results/network-<rate>.json (2 nodes x 2 ranks; other shapes
network-<N>n-<rate>.json), bench/results/network.png (accuracy against wall time), the
summary bench/results/network-rates.json and its figure network-rates.png, and prints tables.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from abtrain import config as abconfig
from abtrain.files import atomic_write_text, read_record
from abtrain.progress import duration
from bench import study
from bench.cluster import Cluster, tbf_burst
from pipeline.common import BENCHMARK_SETS, last_of_each_key, matrix_sets, parser, stage

RESULTS = Path("bench/results")
WORK = Path("runs/bench")


DEFAULT_METHODS = ("ddp", "ab", "powersgd", "ab_powersgd")


def in_matrix(params: dict[str, Any], nodes: int, ranks: int, methods: list[str]) -> list[str]:
    """`methods`, and the benchmark's default methods the matrix has a run of there."""
    from pipeline.common import run_of

    out = list(methods)
    for m in DEFAULT_METHODS:
        try:
            run_of(params, m, nodes, ranks)
        except abconfig.ConfigError:
            continue
        if m not in out:
            out.append(m)
    return out


def ledger_by_node(run_dir: Path, nodes: list[int]) -> dict[int, int]:
    """Inter-node bytes each node's ranks put on the wire, from the ledger."""
    out = {n: 0 for n in set(nodes)}
    for line in (run_dir / "ledger.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["inter_node"]:
            out[nodes[r["rank"]]] += r["wire_bytes"]
    return out


def run_one(method: str, rate: str | None, a: argparse.Namespace, work: Path) -> dict[str, Any]:
    out = work / f"{method}-{a.nodes}x{a.ranks_per_node}-{rate or 'unshaped'}"
    # an earlier benchmark's folder would be resumed (a finished run: no step at all)
    shutil.rmtree(out, ignore_errors=True)
    with Cluster(a.nodes, rate) as c:
        env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0", "PYTHONUNBUFFERED": "1"}
        # every rank shares this machine: torchrun sets 1 thread only for several ranks
        # per node, and one rank per node would otherwise take every core
        threads = max(1, (os.cpu_count() or 1) // (a.nodes * a.ranks_per_node))
        env.setdefault("OMP_NUM_THREADS", str(threads))
        before = [c.counters(i) for i in range(a.nodes)]
        sets = [
            x
            for s in [
                f"method={method}",
                "tracking.enabled=false",
                "tracking.ledger_rows=true",
                *a.set,
                *getattr(a, "method_sets", {}).get(method, []),
            ]
            for x in ("--set", s)
        ]
        start = time.time()
        procs = [
            c.start(
                i,
                [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    f"--nnodes={a.nodes}",
                    f"--nproc-per-node={a.ranks_per_node}",
                    f"--node-rank={i}",
                    f"--master-addr={c.address(0)}",
                    "--master-port=29400",
                    "-m",
                    "abtrain",
                    "train",
                    "--config",
                    a.config,
                    *sets,
                    "--out",
                    str(out),
                ],
                env,
                work / f"{out.name}-node{i}.log",
            )
            for i in range(a.nodes)
        ]
        codes = [p.wait(timeout=a.timeout) for p in procs]
        wall = time.time() - start
        after = [c.counters(i) for i in range(a.nodes)]
    if any(codes):
        raise RuntimeError(f"{method} at {rate}: exit codes {codes}; see {work}/*.log")
    s = json.loads((out / "summary.json").read_text())
    nodes = [r // a.ranks_per_node for r in range(s["world_size"])]
    ledger = ledger_by_node(out, nodes)
    iface = [{k: after[i][k] - before[i][k] for k in ("tx", "rx")} for i in range(a.nodes)]
    return dict(
        method=method,
        rate=rate or "unshaped",
        wall_seconds=wall,
        steps=s["steps"],
        val_top1=s["val_top1"],
        evals=s["evals"],
        compression_ratio=s["compression_ratio"],
        ledger_inter_node_bytes_by_node=ledger,
        interface_bytes_by_node=iface,
        ledger_vs_interface=[
            iface[i]["tx"] / ledger[i] - 1 if ledger[i] else None for i in range(a.nodes)
        ],
        traffic=s["traffic"],
        step_seconds=step_times(out),
    )


def step_times(out: Path) -> dict[str, float]:
    """Mean seconds per step by phase, from the run's log."""
    import csv

    rows = list(csv.DictReader((out / "train_log.csv").open()))
    by: dict[str, list[float]] = {}
    for r in rows:
        if "seconds" in r and r["seconds"]:
            by.setdefault(r["phase"], []).append(float(r["seconds"]))
    return {k: sum(v) / len(v) for k, v in by.items()}


def progress_line(
    k: int,
    n: int,
    method: str,
    rate: str | None,
    elapsed: float,
    result: dict[str, Any] | None = None,
    predicted: list[float] | None = None,
) -> str:
    """`[bench.network] run 3 of 8 started: ab at 200mbit; elapsed 4m10s, ETA 9m45s` and, with
    its result, `... finished: ab at 200mbit in 111 s, best top-1 31.15%; ...`. The ETA is
    the studies' (bench.study.eta): the runs left as `predicted` (each run's predicted
    seconds, `estimate`) has them, scaled by how the finished ones compared with it;
    without it, the finished runs' mean per run (a poor measure: a slow link's run takes
    several times a fast one's)."""
    where = f"{method} at {rate or 'unshaped'}"
    finished = k if result else k - 1
    times: list[float | None] = list(predicted) if predicted else [None] * n
    eta = study.eta(elapsed, times[:finished], times[finished:])
    if result is None:
        return f"[bench.network] run {k} of {n} started: {where}; elapsed {duration(elapsed)}, ETA {eta}"
    return (
        f"[bench.network] run {k} of {n} finished: {where} in {result['wall_seconds']:.0f} s, "
        f"best top-1 {result['val_top1']['best']:.2f}%; elapsed {duration(elapsed)}, ETA {eta}"
    )


def parse_shapes(a: argparse.Namespace) -> list[tuple[int, int, list[str | None]]]:
    """(nodes, ranks per node, rates) of every --shape NxR=RATE,RATE; without --shape, the
    one shape of --nodes, --ranks-per-node and --rates. A rate 'none': unshaped."""
    texts = a.shape or [f"{a.nodes}x{a.ranks_per_node}={a.rates}"]
    out = []
    for text in texts:
        m = re.fullmatch(r"(\d+)x(\d+)=(.+)", text.strip())
        if not m:
            raise SystemExit(f"--shape {text!r}: use NODESxRANKS=RATE[,RATE...], e.g. 4x1=200mbit")
        rates = [None if r in ("none", "unshaped") else r for r in m.group(3).split(",")]
        for r in rates:
            if r is not None:
                tbf_burst(r)  # refuses a rate tc would not read, before any run starts
        out.append((int(m.group(1)), int(m.group(2)), rates))
    return out


def parse_method_sets(texts: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for text in texts:
        method, sep, setting = text.partition(":")
        if not sep or "=" not in setting:
            raise SystemExit(f"--method-set {text!r}: use METHOD:KEY=VALUE")
        out[method] = last_of_each_key([*out.get(method, []), setting])
    return out


def estimate(runs: list[tuple[int, int, str | None, str]], a: argparse.Namespace) -> list[float]:
    """Each run's wall seconds, predicted before running it: the planner's time model with
    the per-phase step times of the committed unshaped 2x2 run (a method it lacks: ab's
    phases, full-rank ones plus PowerSGD's cost over DDP's for a method with PowerSGD),
    plus its start-up and evaluations as that run measured them."""
    import yaml

    from abtrain.timing import predict
    from abtrain.traffic import count_evaluations
    from bench.paper_scale import rate_bytes_per_s

    free = read_record(RESULTS / "network-unshaped.json")
    by = {r["method"]: r for r in free["results"]}
    ddp = by["ddp"]
    start = ddp["wall_seconds"] - ddp["evals"][-1]["seconds"]  # rendezvous, data, saving
    params = yaml.safe_load(Path(a.config).read_text())
    first = abconfig.from_dict(params["train"], ["method=ddp", *free["overrides"]])
    run_s = predict(first, 2, 2, 10, ddp["step_seconds"], None).seconds
    per_eval = (ddp["evals"][-1]["seconds"] - run_s) / max(1, len(ddp["evals"]) - 1)
    out = []
    for nodes, ranks, rate, method in runs:
        cfg = abconfig.from_dict(
            params["train"], [f"method={method}", *a.set, *a.method_sets.get(method, [])]
        )
        if method in by:
            compute = dict(by[method]["step_seconds"])
        else:
            base = by["ab"] if method in abconfig.AB_METHODS and "ab" in by else ddp
            compute = dict(base["step_seconds"])
            if "powersgd" in method and "powersgd" in by:
                extra = by["powersgd"]["step_seconds"]["full"] - ddp["step_seconds"]["full"]
                compute = {k: v + (extra if k != "ab" else 0) for k, v in compute.items()}
        t = predict(cfg, nodes, ranks, 10, compute, rate and rate_bytes_per_s(rate))
        out.append(start + t.seconds + per_eval * (count_evaluations(cfg) - 1))
    return out


def main(argv: list[str] | None = None) -> int:
    p = parser("bench.network", __doc__)
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--ranks-per-node", type=int, default=2)
    p.add_argument(
        "--rates",
        default="50mbit,200mbit,1gbit,none",
        help="link rates of --nodes x --ranks-per-node; none: unshaped",
    )
    p.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NxR=RATES",
        help="nodes x ranks per node and its rates, e.g. --shape 2x2=50mbit,200mbit,1gbit,none "
        "--shape 4x1=200mbit (repeatable; replaces --nodes, --ranks-per-node, --rates)",
    )
    p.add_argument("--methods", default=",".join(DEFAULT_METHODS))
    p.add_argument("--config", default="params.yaml")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an override of every run, over the matrix's values and the benchmark's own: "
        + " ".join(BENCHMARK_SETS),
    )
    p.add_argument(
        "--method-set",
        action="append",
        default=[],
        metavar="METHOD:KEY=VALUE",
        help="an override for one method only, over the matrix's values",
    )
    p.add_argument(
        "--no-matrix",
        action="store_true",
        help="train's values as params.yaml gives them, not those of the matrix's runs",
    )
    p.add_argument(
        "--merge",
        action="store_true",
        help="keep the other methods' runs already in the results' network-*.json and "
        "replace only these methods' (a rerun of one method after a change to it); "
        "refused where those runs were made with other --set values",
    )
    p.add_argument(
        "--results",
        type=Path,
        default=None,
        help=f"where the per-rate files, figures and summary go (default: {RESULTS})",
    )
    p.add_argument(
        "--work", type=Path, default=WORK, help="the run folders and their logs (fresh each run)"
    )
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="list the runs and their predicted wall time (time model and the committed "
        "unshaped run); run nothing",
    )
    a = p.parse_args(argv)
    a.results = a.results or RESULTS
    shapes = parse_shapes(a)
    methods = a.methods.split(",")
    shared, own = [], {}
    if not a.no_matrix:
        import yaml

        params = yaml.safe_load(Path(a.config).read_text())
        # shared and own split over every method the matrix has there, not only these: a
        # rerun of one method (--merge) records its runs as the others were recorded
        matrix = {
            (n, r): matrix_sets(params, n, r, in_matrix(params, n, r, methods))
            for n, r, _ in shapes
        }
        if len({json.dumps(v) for v in matrix.values()}) > 1:
            raise SystemExit(
                "bench.network: the matrix trains these shapes with different values "
                "(another world size); run them in separate commands"
            )
        shared, own = next(iter(matrix.values()))
    a.set = last_of_each_key([*shared, *BENCHMARK_SETS, *a.set])
    a.method_sets = parse_method_sets(
        [f"{m}:{s}" for m, sets in own.items() for s in sets] + a.method_set
    )
    runs = [(n, r, rate, m) for n, r, rates in shapes for rate in rates for m in methods]
    if a.dry_run:
        seconds = estimate(runs, a)
        for k, ((n, r, rate, m), s) in enumerate(zip(runs, seconds), 1):
            print(f"run {k:>2} of {len(runs)}: {n}x{r} {rate or 'unshaped':>9} {m:<12} ~{s:5.0f} s")
        print(f"predicted wall time: {duration(sum(seconds))} for {len(runs)} runs")
        return 0
    if a.merge:  # before hours of runs, not after
        for nodes, ranks, rates in shapes:
            for rate in rates:
                check_merge(
                    argparse.Namespace(**{**vars(a), "nodes": nodes, "ranks_per_node": ranks}), rate
                )
    a.results.mkdir(parents=True, exist_ok=True)
    work = a.work
    work.mkdir(parents=True, exist_ok=True)
    try:  # the ETA's measure; none where no committed unshaped run says how long steps take
        predicted = estimate(runs, a)
    except (OSError, KeyError, ValueError, IndexError, abconfig.ConfigError):
        predicted = None
    t0, k = time.monotonic(), 0
    for nodes, ranks, rates in shapes:
        shape = argparse.Namespace(**{**vars(a), "nodes": nodes, "ranks_per_node": ranks})
        for rate in rates:
            results = []
            for method in methods:
                k += 1
                elapsed = time.monotonic() - t0
                print(
                    progress_line(k, len(runs), method, rate, elapsed, None, predicted), flush=True
                )
                results.append(run_one(method, rate, shape, work))
                elapsed = time.monotonic() - t0
                done = progress_line(k, len(runs), method, rate, elapsed, results[-1], predicted)
                print(done, flush=True)
            own = recorded_method_sets(shape, rate, methods)
            if a.merge:
                results = merged(shape, rate, results)
            write_rate(shape, rate, results, own)
    plot(a.results)
    from bench.rates import MixedOverrides

    try:
        summary = summarise(a.config, a.results)
    except MixedOverrides as err:  # runs of other overrides beside these: not one table
        print(f"bench.network: no summary: {err}", file=sys.stderr)
        return 2
    if summary:
        print_summary(summary)
    return 0


def summarise(config: str, results: Path | None = None) -> dict[str, Any] | None:
    """Time to target over every committed rate and shape (bench.rates)."""
    import yaml

    from bench import rates

    return rates.summarise(yaml.safe_load(Path(config).read_text()), results or RESULTS)


def print_summary(summary: dict[str, Any]) -> None:
    from bench import rates

    rates.print_summary(summary)


def committed(a: argparse.Namespace, rate: str | None) -> dict[str, Any] | None:
    """The per-rate file of this shape and rate already in the results, if any."""
    from bench.rates import result_name

    results = getattr(a, "results", None) or RESULTS
    path = results / f"{result_name(a.nodes, a.ranks_per_node, rate)}.json"
    return {**read_record(path), "file": str(path)} if path.exists() else None


def check_merge(a: argparse.Namespace, rate: str | None) -> None:
    """--merge keeps the other methods' runs: only where they were made with these --set
    values (each method's own may change: its runs are the ones replaced)."""
    from bench.rates import normalised

    old = committed(a, rate)
    if old is None:
        return
    was = old.get("overrides")
    if was is None or normalised(was, old["file"]) != normalised(a.set, "--set"):
        raise SystemExit(
            f"--merge: {old['file']} was made with "
            f"{' '.join(was) if was is not None else 'unrecorded overrides'}, these runs with "
            f"{' '.join(a.set)}; one file would hold runs of both. Run every method instead."
        )


def merged(
    a: argparse.Namespace, rate: str | None, new: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The committed runs of this shape and rate, with `new`'s methods replaced, in order."""
    old = committed(a, rate)
    fresh = {r["method"]: r for r in new}
    out = [fresh.pop(r["method"], r) for r in (old["results"] if old else [])]
    return out + list(fresh.values())


def recorded_method_sets(
    a: argparse.Namespace, rate: str | None, methods: list[str]
) -> dict[str, list[str]]:
    """Each method's own overrides, as its runs in the file were made: those of this
    command for the methods it ran, the file's for the runs --merge keeps."""
    old = committed(a, rate) if getattr(a, "merge", False) else None
    kept = {r["method"] for r in old["results"] if r["method"] not in methods} if old else set()
    was = (old or {}).get("method_overrides") or {}
    return {
        **{m: v for m, v in was.items() if m in kept},
        **{m: a.method_sets[m] for m in methods if m in a.method_sets},
    }


def write_rate(
    a: argparse.Namespace,
    rate: str | None,
    results: list[dict[str, Any]],
    method_overrides: dict[str, list[str]] | None = None,
) -> None:
    """network-<rate>.json of one shape and rate, and its table. Its target: the lowest
    of these runs' best top-1 smoothed over 2 evaluations (bench.rates; the summary's
    target is the lowest over every rate of the shape)."""
    from bench.rates import best, reach, result_name

    target = min(best(r["evals"]) for r in results)
    for r in results:
        got = reach(r["evals"], target)
        r["target_top1"] = target
        r["steps_to_target"] = got and got["step"]
        r["seconds_to_target"] = got and got["seconds"]
    try:
        from abtrain.preflight import data_classes

        cfg = abconfig.load(a.config, a.set)
        classes: int | None = data_classes(cfg)[0]
        model: dict[str, Any] | None = cfg.model.model_dump(mode="json")
    except (abconfig.ConfigError, OSError):
        classes, model = None, None
    name = result_name(a.nodes, a.ranks_per_node, rate)
    if method_overrides is None:
        ran = {r["method"] for r in results}
        method_overrides = {m: v for m, v in getattr(a, "method_sets", {}).items() if m in ran}
    atomic_write_text(
        (getattr(a, "results", None) or RESULTS) / f"{name}.json",
        json.dumps(
            dict(
                nodes=a.nodes,
                ranks_per_node=a.ranks_per_node,
                rate=rate or "unshaped",
                overrides=a.set,
                method_overrides=method_overrides,
                classes=classes,
                model=model,  # the report names a benchmark of another model apart
                results=results,
            ),
            indent=2,
        ),
    )
    print(
        f"\n{a.nodes}x{a.ranks_per_node} rate {rate or 'unshaped'}: target top-1 {target:.2f}% "
        "(smoothed over 2 evaluations)"
    )
    print(
        f"{'method':<13}{'top1':>7}{'to target s':>13}{'wall s':>8}"
        f"{'iface tx MB/node':>18}{'ledger MB/node':>16}{'diff':>7}"
    )
    for r in results:
        tx = sum(i["tx"] for i in r["interface_bytes_by_node"]) / a.nodes / 1e6
        led = sum(r["ledger_inter_node_bytes_by_node"].values()) / a.nodes / 1e6
        t = r["seconds_to_target"]
        print(
            f"{r['method']:<13}{r['val_top1']['final']:>7.2f}{t if t else float('nan'):>13.1f}"
            f"{r['wall_seconds']:>8.1f}{tx:>18.2f}{led:>16.2f}{tx / led - 1:>+7.1%}"
        )


def plot(results: Path | None = None) -> None:
    """network.png in the results: validation top-1 against wall time, one panel per rate
    and shape (the summary's figure is bench.rates'); each method in its colour and marker
    of pipeline.style, one legend for all panels, where no data is."""
    from bench.rates import load
    from pipeline import style

    results = results or RESULTS
    files = load(results)
    if not files:
        return
    cols = min(3, len(files))
    rows = -(-len(files) // cols)
    methods = style.ordered(r["method"] for d in files for r in d["results"])
    with style.matplotlib_defaults() as plt:
        fig, axes = plt.subplots(
            rows, cols, figsize=(6 * cols, 4 * rows), squeeze=False, layout="constrained"
        )
        spare = list(axes.flat[len(files) :])
        for ax in spare:
            ax.axis("off")
        for ax, d in zip(axes.flat, files):
            for r in sorted(d["results"], key=lambda r: style.rank(r["method"])):
                ax.plot(
                    [e["seconds"] for e in r["evals"]],
                    [e["val_top1"] for e in r["evals"]],
                    **{
                        **style.marker(r["method"], edge="white"),
                        "ms": 0.85 * style.size(r["method"]),
                    },
                    lw=1.2,
                )
            ax.axhline(d["results"][0]["target_top1"], color="grey", ls=":", lw=1, zorder=1)
            ax.set(
                title=f"{d['nodes']} nodes x {d['ranks_per_node']} ranks, link {d['rate']}",
                xlabel="wall time (s)",
                ylabel="validation top-1 (%)",
            )
            ax.grid(alpha=0.3)
        key = style.handles(methods, edge="white")
        key.append(
            plt.Line2D(
                [], [], color="grey", ls=":", label="target: the runs' lowest best top-1 (smoothed)"
            )
        )
        if spare:  # the empty panel holds the legend
            spare[0].legend(handles=key, loc="center", title="method")
        else:
            fig.legend(handles=key, loc="outside right upper", title="method")
        style.save(fig, results / "network.png", dpi=100)


if __name__ == "__main__":
    sys.exit(stage(main, who="bench"))
