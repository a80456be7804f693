"""Benchmark on an emulated cluster: every method on the same model, data and seed, over
real links of chosen speeds; traffic counted at the interfaces and by the ledger; time to a
common accuracy at each rate, measured and predicted (bench.rates).

    sudo-less as root here (--dry-run predicts its wall time):
    python -m bench.network --shape 2x2=50mbit,200mbit,1gbit,none --shape 4x1=200mbit

A study of the skeleton (bench.study): its plan is every shape, rate and method; each run
trains on a cluster of its own (bench.cluster) and leaves `measured.json` (its wall time and
interface counters) beside the launcher's files. A killed benchmark continues: a run that
left its measurement is read back, provided it was made with these values; any other is
trained again from a fresh folder (a resumed run's wall time would mix two sessions). Its
record is the per-rate files, its summary and figure bench.rates' (`--render` is
`python -m bench.rates`).

Every run trains as the matrix's run of its method at the same world size trains
(`experiments.runs` resolved by pipeline.matrix: steps, batch, the search's best values, the
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
import csv
import json
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from abtrain import config as abconfig
from abtrain.files import read_record, write_record
from bench import study
from bench.cluster import Cluster, tbf_burst
from bench.rates import RESULTS, MixedOverrides, Rates, best, normalised, reach, result_name
from pipeline.matrix import BENCHMARK_SETS, last_of_each_key, matrix_sets
from pipeline.stage import parser, stage

WORK = Path("runs/bench")
DEFAULT_METHODS = ("ddp", "ab", "powersgd", "ab_powersgd")
MEASURED = "measured.json"  # a run's wall time and interface counters, beside its summary
Shape = tuple[int, int, list[str | None]]  # nodes, ranks per node, rates (None: unshaped)


@dataclass
class Network(Rates):
    """bench.rates' study with the runs that make its per-rate files."""

    shapes: list[Shape] = field(default_factory=list)
    methods: list[str] = field(default_factory=lambda: list(DEFAULT_METHODS))
    sets: list[str] = field(default_factory=list)  # every run's overrides
    method_sets: dict[str, list[str]] = field(default_factory=dict)  # a method's own
    work: Path = WORK
    merge: bool = False  # keep the per-rate files' other methods, replace these
    timeout: float = 3600

    name: ClassVar[str] = "network"
    basis: ClassVar[str] = "the time model with the committed unshaped 2x2 runs' step times"

    # ------------------------------------------------------------ plan
    def runs(self) -> list[study.Run]:
        keys = [
            (n, r, rate, m) for n, r, rates in self.shapes for rate in rates for m in self.methods
        ]
        if self.merge:  # before hours of runs, not after
            for n, r, rates in self.shapes:
                for rate in rates:
                    self.check_merge(n, r, rate)
        seconds = self.estimates(keys)
        return [
            study.Run(
                name=f"{m} at {rate or 'unshaped'} on {n}x{r}",
                folder=self.work / f"{m}-{n}x{r}-{rate or 'unshaped'}",
                sets=self.run_sets(m),
                nodes=n,
                ranks_per_node=r,
                config=str(self.config),
                seconds=s,
                info=dict(method=m, rate=rate),
                done=MEASURED,
                launch=self.measure,
            )
            for (n, r, rate, m), s in zip(keys, seconds)
        ]

    def run_sets(self, method: str) -> list[str]:
        own = self.method_sets.get(method, [])
        return [
            f"method={method}",
            "tracking.enabled=false",
            "tracking.ledger_rows=true",
            *self.sets,
            *own,
        ]

    def found(self, run: study.Run) -> str | None:
        """A run measured with these values; a folder of other values is not this run."""
        path = run.folder / MEASURED
        if path.exists() and read_record(path).get("sets") == run.sets:
            return str(run.folder)
        return None

    def estimates(self, keys: list[tuple[int, int, str | None, str]]) -> list[float | None]:
        """Each run's wall seconds, predicted before running it: the time model with the
        per-phase step times of the committed unshaped 2x2 runs (a method they lack: ab's
        phases, full-rank ones plus PowerSGD's cost over DDP's for a method with
        PowerSGD), plus its start-up and evaluations as those runs measured them. None
        each where no committed run says how long a step takes."""
        import yaml

        from abtrain.predict.timing import predict
        from abtrain.predict.traffic import count_evaluations
        from bench.paper_scale import rate_bytes_per_s

        try:
            free = read_record(RESULTS / "network-unshaped.json")
            params = yaml.safe_load(Path(self.config).read_text())
            first = abconfig.from_dict(params["train"], ["method=ddp", *free["overrides"]])
        except (OSError, KeyError, ValueError, SystemExit, abconfig.ConfigError):
            return [None] * len(keys)
        by = {r["method"]: r for r in free["results"]}
        ddp = by["ddp"]
        start = ddp["wall_seconds"] - ddp["evals"][-1]["seconds"]  # rendezvous, data, saving
        run_s = predict(first, 2, 2, 10, ddp["step_seconds"], None).seconds
        per_eval = (ddp["evals"][-1]["seconds"] - run_s) / max(1, len(ddp["evals"]) - 1)
        out: list[float | None] = []
        for nodes, ranks, rate, method in keys:
            cfg = abconfig.from_dict(
                params["train"], [f"method={method}", *self.sets, *self.method_sets.get(method, [])]
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

    # ------------------------------------------------------------ train
    def measure(self, run: study.Run) -> None:
        """Train `run` on a cluster of its own, with its link; its wall time and the bytes
        each node's interface sent and received, into its folder."""
        shutil.rmtree(run.folder, ignore_errors=True)  # half a run: its timings start again
        n, rate = run.nodes, run["rate"]
        logs = [self.work / f"{run.folder.name}-node{i}.log" for i in range(n)]
        with Cluster(n, rate) as c:
            env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0", "PYTHONUNBUFFERED": "1"}
            # every rank shares this machine: torchrun sets 1 thread only for several ranks
            # per node, and one rank per node would otherwise take every core
            threads = max(1, (os.cpu_count() or 1) // (n * run.ranks_per_node))
            env.setdefault("OMP_NUM_THREADS", str(threads))
            before = [c.counters(i) for i in range(n)]
            began = time.time()
            procs = [
                c.start(i, self.node_command(run, i, c.address(0)), env, logs[i]) for i in range(n)
            ]
            codes = [p.wait(timeout=self.timeout) for p in procs]
            wall = time.time() - began
            after = [c.counters(i) for i in range(n)]
        if any(codes):
            raise RuntimeError(f"{run.name}: exit codes {codes}; see {', '.join(map(str, logs))}")
        iface = [{k: after[i][k] - before[i][k] for k in ("tx", "rx")} for i in range(n)]
        measured = dict(sets=run.sets, wall_seconds=wall, interface_bytes_by_node=iface)
        write_record(run.folder / MEASURED, measured, end="\n")
        got = self.result(run)
        self.say(f"{run.name}: {wall:.0f} s, best top-1 {got['val_top1']['best']:.2f}%")

    @staticmethod
    def node_command(run: study.Run, node: int, master: str) -> list[str]:
        """One node's torchrun, rendezvous at node 0's address on its cluster network."""
        torchrun = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={run.nodes}"]
        torchrun += [f"--nproc-per-node={run.ranks_per_node}", f"--node-rank={node}"]
        torchrun += [f"--master-addr={master}", "--master-port=29400"]
        train = ["-m", "abtrain", "train", "--config", run.config]
        return [
            *torchrun,
            *train,
            *(x for s in run.sets for x in ("--set", s)),
            "--out",
            str(run.folder),
        ]

    # ------------------------------------------------------------ report
    def result(self, run: study.Run) -> dict[str, Any]:
        """A measured run as its per-rate file keeps it."""
        measured = read_record(run.folder / MEASURED)
        s = read_record(run.folder / "summary.json")
        nodes = [r // run.ranks_per_node for r in range(s["world_size"])]
        ledger = ledger_by_node(run.folder, nodes)
        iface = measured["interface_bytes_by_node"]
        return dict(
            method=run["method"],
            rate=run["rate"] or "unshaped",
            wall_seconds=measured["wall_seconds"],
            steps=s["steps"],
            val_top1=s["val_top1"],
            evals=s["evals"],
            compression_ratio=s["compression_ratio"],
            ledger_inter_node_bytes_by_node=ledger,
            interface_bytes_by_node=iface,
            ledger_vs_interface=[
                iface[i]["tx"] / ledger[i] - 1 if ledger[i] else None for i in range(run.nodes)
            ],
            traffic=s["traffic"],
            step_seconds=step_times(run.folder),
        )

    def aggregate(self, runs: list[study.Run]) -> dict[str, Any]:
        """Each shape and rate whose runs all finished as its per-rate file, network.png,
        then the summary of every per-rate file (bench.rates)."""
        by: dict[tuple[int, int, str | None], list[study.Run]] = {}
        for run in runs:
            by.setdefault((run.nodes, run.ranks_per_node, run["rate"]), []).append(run)
        for (n, r, rate), group in by.items():
            if all(self.found(run) for run in group):
                results = [self.result(run) for run in group]
                own = self.recorded_method_sets(n, r, rate)
                if self.merge:
                    results = self.merged(n, r, rate, results)
                self.write_rate(n, r, rate, results, own)
        plot(self.out)
        return super().aggregate(runs)

    def committed(self, nodes: int, ranks: int, rate: str | None) -> dict[str, Any] | None:
        """The per-rate file of this shape and rate already in `out`, if any."""
        path = self.out / f"{result_name(nodes, ranks, rate)}.json"
        return {**read_record(path), "file": str(path)} if path.exists() else None

    def check_merge(self, nodes: int, ranks: int, rate: str | None) -> None:
        """--merge keeps the other methods' runs: only where they were made with these --set
        values (each method's own may change: its runs are the ones replaced)."""
        old = self.committed(nodes, ranks, rate)
        if old is None:
            return
        was = old.get("overrides")
        if was is None or normalised(was, old["file"]) != normalised(self.sets, "--set"):
            raise SystemExit(
                f"--merge: {old['file']} was made with "
                f"{' '.join(was) if was is not None else 'unrecorded overrides'}, these runs "
                f"with {' '.join(self.sets)}; one file would hold runs of both. Run every "
                "method instead."
            )

    def merged(
        self, nodes: int, ranks: int, rate: str | None, new: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """The committed runs of this shape and rate, `new`'s methods replaced, in order."""
        old = self.committed(nodes, ranks, rate)
        fresh = {r["method"]: r for r in new}
        out = [fresh.pop(r["method"], r) for r in (old["results"] if old else [])]
        return out + list(fresh.values())

    def recorded_method_sets(
        self, nodes: int, ranks: int, rate: str | None
    ) -> dict[str, list[str]]:
        """Each method's own overrides, as its runs in the file were made: this command's
        for the methods it ran, the file's for the runs --merge keeps."""
        old = self.committed(nodes, ranks, rate) if self.merge else None
        kept = (
            {r["method"] for r in old["results"] if r["method"] not in self.methods}
            if old
            else set()
        )
        was = (old or {}).get("method_overrides") or {}
        return {
            **{m: v for m, v in was.items() if m in kept},
            **{m: self.method_sets[m] for m in self.methods if m in self.method_sets},
        }

    def write_rate(
        self,
        nodes: int,
        ranks: int,
        rate: str | None,
        results: list[dict[str, Any]],
        method_overrides: dict[str, list[str]] | None = None,
    ) -> None:
        """network-<rate>.json of one shape and rate, and its table. Its target: the lowest
        of these runs' best top-1 smoothed over 2 evaluations (bench.rates; the summary's
        target is the lowest over every rate of the shape)."""
        target = min(best(r["evals"]) for r in results)
        for r in results:
            got = reach(r["evals"], target)
            r["target_top1"] = target
            r["steps_to_target"] = got and got["step"]
            r["seconds_to_target"] = got and got["seconds"]
        try:
            from abtrain.commands.preflight import data_classes

            cfg = abconfig.load(self.config, self.sets)
            classes: int | None = data_classes(cfg)[0]
            model: dict[str, Any] | None = cfg.model.model_dump(mode="json")
        except (abconfig.ConfigError, OSError):
            classes, model = None, None
        if method_overrides is None:
            ran = {r["method"] for r in results}
            method_overrides = {m: v for m, v in self.method_sets.items() if m in ran}
        record = dict(
            nodes=nodes,
            ranks_per_node=ranks,
            rate=rate or "unshaped",
            overrides=self.sets,
            method_overrides=method_overrides,
            classes=classes,
            model=model,  # the report names a benchmark of another model apart
            results=results,
        )
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / f"{result_name(nodes, ranks, rate)}.json"
        write_record(path, record)
        print(rate_table(record), flush=True)


def rate_table(d: dict[str, Any]) -> str:
    """A per-rate file as the command prints it: each method's top-1, time to the target,
    wall time and inter-node bytes at the interface and in the ledger."""
    results, nodes = d["results"], d["nodes"]
    lines = [
        f"\n{nodes}x{d['ranks_per_node']} rate {d['rate']}: target top-1 "
        f"{results[0]['target_top1']:.2f}% (smoothed over 2 evaluations)",
        f"{'method':<13}{'top1':>7}{'to target s':>13}{'wall s':>8}"
        f"{'iface tx MB/node':>18}{'ledger MB/node':>16}{'diff':>7}",
    ]
    for r in results:
        tx = sum(i["tx"] for i in r["interface_bytes_by_node"]) / nodes / 1e6
        led = sum(r["ledger_inter_node_bytes_by_node"].values()) / nodes / 1e6
        t = r["seconds_to_target"]
        lines.append(
            f"{r['method']:<13}{r['val_top1']['final']:>7.2f}{t if t else float('nan'):>13.1f}"
            f"{r['wall_seconds']:>8.1f}{tx:>18.2f}{led:>16.2f}{tx / led - 1:>+7.1%}"
        )
    return "\n".join(lines)


def ledger_by_node(run_dir: Path, nodes: list[int]) -> dict[int, int]:
    """Inter-node bytes each node's ranks put on the wire, from the ledger."""
    out = {n: 0 for n in set(nodes)}
    for line in (run_dir / "ledger.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["inter_node"]:
            out[nodes[r["rank"]]] += r["wire_bytes"]
    return out


def step_times(out: Path) -> dict[str, float]:
    """Mean seconds per step by phase, from the run's log."""
    rows = list(csv.DictReader((out / "train_log.csv").open()))
    by: dict[str, list[float]] = {}
    for r in rows:
        if "seconds" in r and r["seconds"]:
            by.setdefault(r["phase"], []).append(float(r["seconds"]))
    return {k: sum(v) / len(v) for k, v in by.items()}


# ---------------------------------------------------------------- the command line
def in_matrix(params: dict[str, Any], nodes: int, ranks: int, methods: list[str]) -> list[str]:
    """`methods`, and the benchmark's default methods the matrix has a run of there."""
    from pipeline.matrix import run_of

    out = list(methods)
    for m in DEFAULT_METHODS:
        try:
            run_of(params, m, nodes, ranks)
        except abconfig.ConfigError:
            continue
        if m not in out:
            out.append(m)
    return out


def parse_shapes(a: argparse.Namespace) -> list[Shape]:
    """(nodes, ranks per node, rates) of every --shape NxR=RATE,RATE; without --shape, the
    one shape of --nodes, --ranks-per-node and --rates. A rate 'none': unshaped."""
    texts = a.shape or [f"{a.nodes}x{a.ranks_per_node}={a.rates}"]
    out: list[Shape] = []
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


def overrides(a: argparse.Namespace, shapes: list[Shape]) -> tuple[list[str], dict[str, list[str]]]:
    """Every run's overrides and each method's own: the matrix's values at these shapes
    (none with --no-matrix), the benchmark's measurement, then --set and --method-set."""
    shared: list[str] = []
    own: dict[str, list[str]] = {}
    if not a.no_matrix:
        import yaml

        params = yaml.safe_load(Path(a.config).read_text())
        methods = a.methods.split(",")
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
    sets = last_of_each_key([*shared, *BENCHMARK_SETS, *a.set])
    mine = parse_method_sets([f"{m}:{s}" for m, v in own.items() for s in v] + a.method_set)
    return sets, mine


def main(argv: list[str] | None = None) -> int:
    p = parser("bench.network", __doc__)
    study.options(p, WORK, RESULTS, runs_flags=("--work",), out_flags=("--results",))
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
    p.add_argument("--timeout", type=float, default=3600, help="a node's seconds, at most")
    a = p.parse_args(argv)
    shapes = parse_shapes(a)
    sets, method_sets = overrides(a, shapes) if not a.render else ([], {})
    bench = Network(
        out=a.out,
        command=study.shown("bench.network", argv),
        config=a.config,
        shapes=shapes,
        methods=a.methods.split(","),
        sets=sets,
        method_sets=method_sets,
        work=a.runs_dir,
        merge=a.merge,
        timeout=a.timeout,
    )
    try:
        return study.conduct(bench, a)
    except MixedOverrides as err:  # runs of other overrides beside these: not one table
        print(f"bench.network: no summary: {err}", file=sys.stderr)
        return 2


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
