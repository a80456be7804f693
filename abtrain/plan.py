"""`python -m abtrain plan`: which method pays off. Each method's expected seconds per step
and for the run on a cluster and link, predicted without training (from a compute file or a
few steps timed here), and the method it recommends."""

from __future__ import annotations

import csv
import json
import os
import re
import sys
import tempfile
import typing
from pathlib import Path

from abtrain import launch
from abtrain.config import BASELINE, ConfigError, Method, load

# abtrain.planner and abtrain.methods import torch: they are imported where used, because
# every command builds this command's parser (`python -m abtrain --help` should stay fast).

PLAN_ASSUMES = (
    "assumes every method needs the same number of steps to reach a given accuracy "
    "(bench.network measures how far that holds: bench/results/network-rates.json)"
)
# the schedule of a --measure run: every phase kind and two syncs in a few steps
MEASURE_SETS = [
    "steps=24",
    "eval_every=24",
    "checkpoint_every=0",
    "ab.warmup_steps=6",
    "ab.ab_steps=6",
    "ab.rebound_steps=4",
    "ab.lr_rebound_steps=2",
    "optim.lr_warmup_steps=2",
    "powersgd.start_iter=2",
    "tracking.enabled=false",
]


def add_parser(sub) -> None:
    plan = sub.add_parser(
        "plan",
        help="predict each method's time per step and run on a cluster and link; recommend one",
        description="Each method's expected seconds per step and for the run, and its "
        "inter-node bytes per rank, from the planner's time model: a step takes its compute "
        "time plus the time its node's inter-node bytes take over the link (no overlap). "
        "The recommendation is the fastest predicted run; it " + PLAN_ASSUMES + ".",
    )
    plan.add_argument("--config", required=True)
    plan.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    plan.add_argument("--nodes", type=int, required=True)
    plan.add_argument("--ranks-per-node", type=int, required=True)
    plan.add_argument(
        "--link",
        required=True,
        help="one node's link, each direction: 200mbit, 1gbit, 25gbit, none (costs nothing), "
        "or bytes/s (25e9)",
    )
    source = plan.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--compute",
        metavar="FILE.json",
        help="per-method per-phase seconds per step without the network: "
        '{"ddp": {"full": 0.31}, "ab": {"warmup": 0.32, "ab": 0.35, "rebound": 0.41}}, '
        "or a bench.network results file (its step_seconds; take the unshaped one)",
    )
    source.add_argument(
        "--measure",
        action="store_true",
        help="time a few steps of each method on this machine at the requested shape "
        "(python -m abtrain.launch, all ranks on this machine, tracking off)",
    )
    plan.add_argument(
        "--methods", default=None, help="comma-separated (default: every method abtrain has)"
    )
    plan.add_argument(
        "--classes", type=int, default=None, help="default: from the config's data set"
    )


def link_bytes_per_s(text: str) -> float | None:
    """'200mbit', '1gbit', '25e9' (bytes/s) -> bytes/s; 'none' or 'unshaped' -> None."""
    t = text.strip().lower()
    if t in ("none", "unshaped", "inf"):
        return None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(k|m|g)bit", t)
    if m:
        return float(m.group(1)) * {"k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] / 8
    try:
        value = float(t)
    except ValueError:
        value = 0.0
    if value > 0:
        return value
    raise ConfigError(f"--link {text!r}: use e.g. 200mbit, 1gbit, none, or bytes/s like 25e9")


def data_classes(cfg) -> tuple[int, str]:
    """How many classes the config's data set has, and where that number comes from."""
    d = cfg.data
    if d.name == "synthetic":
        return d.classes, "data.classes"
    known = {"cifar10": 10, "cifar100": 100, "imagenet": 1000}
    meta = Path(d.prepared) / "meta.json"
    if meta.exists():
        classes = json.loads(meta.read_text()).get("classes")
        if classes:
            return len(classes), str(meta)
    if d.name in known:
        return known[d.name], f"data.name={d.name}"
    raise ConfigError(
        f"the number of classes of data.name={d.name} is in {meta}, which does not exist: "
        f"run `python -m abtrain prepare --config ...` or pass --classes N"
    )


def read_compute(path: str) -> tuple[dict[str, dict[str, float]], str]:
    """Per-method per-phase compute seconds from FILE: a mapping method -> {phase: s}, or
    a bench.network results file (each result's step_seconds)."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"--compute {path}: {err}") from None
    if isinstance(raw, dict) and isinstance(raw.get("results"), list):
        out = {r["method"]: dict(r["step_seconds"]) for r in raw["results"]}
        shape = f"{raw.get('nodes')}x{raw.get('ranks_per_node')}"
        what = f"bench.network run at {shape} ranks, link {raw.get('rate')}"
        if raw.get("rate") not in ("unshaped", None):
            what += "; a shaped run's step times hold network time already"
        return out, f"{path} ({what})"
    ok = isinstance(raw, dict) and all(
        isinstance(v, dict) and all(isinstance(x, int | float) for x in v.values())
        for v in raw.values()
    )
    if not ok:
        raise ConfigError(
            f"--compute {path}: expected {{method: {{phase: seconds}}}} or a bench.network "
            "results file"
        )
    return {m: {k: float(x) for k, x in v.items()} for m, v in raw.items()}, path


def phase_compute(p, step_seconds: dict[str, float]) -> dict[str, float]:
    """`timing`'s compute from a run's per-phase mean step seconds: a phase kind the run's
    log has no name for (a combined method's uncompressed first full-rank steps) computes
    as a full-rank step of the warm-up."""
    out = dict(step_seconds)
    if not out or "full" in out:
        return out
    fallback = out.get("warmup", sum(out.values()) / len(out))
    for kind in p.steps:
        out.setdefault(kind, fallback)
    return out


def predict(cfg, nodes: int, ranks_per_node: int, classes: int, step_seconds, link):
    """The planner's plan and timing of `cfg` on nodes x ranks_per_node over `link`."""
    from abtrain.planner import plan, timing

    p = plan(cfg, nodes, ranks_per_node, classes)
    return timing(p, ranks_per_node, phase_compute(p, step_seconds), link)


def measure_compute(
    config: str, overrides: list[str], methods: list[str], nodes: int, ranks_per_node: int
) -> dict[str, dict[str, float]]:
    """Per-phase seconds per step of each method, timed here: a few steps at the requested
    shape (all its ranks on this machine, over loopback). Each phase's mean leaves out its
    first step; what a phase change costs beyond DDP's start (SVDs, merges, re-wrapping,
    the first steps after it) goes into 'sync', per sync."""
    out: dict[str, dict[str, float]] = {}
    extra: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="abtrain-plan-") as tmp:
        for method in [BASELINE, *[m for m in methods if m != BASELINE]]:
            run = Path(tmp) / method
            sets = [
                x for o in [*overrides, *MEASURE_SETS, f"method={method}"] for x in ("--set", o)
            ]
            args = ["train", "--config", config, *sets, "--out", str(run)]
            print(f"measuring {method} on {nodes}x{ranks_per_node} ranks ...", flush=True)
            log = Path(tmp) / f"{method}.log"
            with open(log, "w") as f:  # the runs' own output goes to their log
                saved = os.dup(1), os.dup(2)
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(f.fileno(), 1)
                os.dup2(f.fileno(), 2)
                try:
                    code = launch.run_local(nodes, ranks_per_node, args)
                finally:
                    os.dup2(saved[0], 1)
                    os.dup2(saved[1], 2)
                    os.close(saved[0])
                    os.close(saved[1])
            if code:
                tail = "\n".join(log.read_text().splitlines()[-15:])
                raise ConfigError(f"--measure: {method} failed (exit {code}):\n{tail}")
            rows = list(csv.DictReader((run / "train_log.csv").open()))
            by: dict[str, list[float]] = {}
            prev = None
            for r in rows:
                if r["phase"] != prev:  # a phase's first step: DDP's first buckets, warm-up
                    prev = r["phase"]
                    continue
                by.setdefault(r["phase"], []).append(float(r["seconds"]))
            steady = {k: sum(v) / len(v) for k, v in by.items()}
            summary = json.loads((run / "summary.json").read_text())
            counted = sum(steady[r["phase"]] for r in rows if r["phase"] in steady)
            # training time the steady step means leave out: start, phase changes
            extra[method] = summary["evals"][-1]["seconds"] - counted
            out[method] = steady
            syncs = len([1 for a, b in zip(rows, rows[1:]) if a["phase"] == "ab" != b["phase"]])
            if syncs and method != BASELINE:
                out[method]["sync"] = max(0.0, (extra[method] - extra[BASELINE]) / syncs)
            print(f"  {', '.join(f'{k} {v:.3f} s' for k, v in out[method].items())}", flush=True)
    return {m: out[m] for m in methods if m in out}


def run(args) -> int:
    from abtrain.methods import check_world

    try:
        all_methods = list(typing.get_args(Method))
        methods = args.methods.split(",") if args.methods else all_methods
        unknown = [m for m in methods if m not in all_methods]
        if unknown:
            raise ConfigError(f"--methods: unknown {unknown}; abtrain has {all_methods}")
        link = link_bytes_per_s(args.link)
        cfg = load(args.config, args.overrides)
        classes, origin = (args.classes, "--classes") if args.classes else data_classes(cfg)
        cfgs, skipped = {}, {}
        for m in methods:
            try:
                c = load(args.config, [*args.overrides, f"method={m}"])
                check_world(c, args.nodes * args.ranks_per_node, args.ranks_per_node)
                cfgs[m] = c
            except ConfigError as err:
                skipped[m] = str(err).splitlines()[-1].strip()
        if args.compute:
            compute, source = read_compute(args.compute)
            shape = f"at {args.nodes}x{args.ranks_per_node} ranks"
            if " ranks, link" in source and shape not in source:
                source += f"; applied {shape}"
        else:
            compute = measure_compute(
                args.config, args.overrides, list(cfgs), args.nodes, args.ranks_per_node
            )
            source = f"measured here, {args.nodes}x{args.ranks_per_node} ranks"
        rows = []
        for m, c in cfgs.items():
            if m not in compute:
                skipped[m] = f"no compute times for it in {args.compute}"
                continue
            t = predict(c, args.nodes, args.ranks_per_node, classes, compute[m], link)
            rows.append((m, t))
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not rows:
        print("error: no method could be planned: " + "; ".join(skipped.values()), file=sys.stderr)
        return 2
    link_text = "costs nothing" if link is None else f"{link / 1e6:.1f} MB/s per node each way"
    print(
        f"{args.nodes} nodes x {args.ranks_per_node} ranks, link {args.link} ({link_text}), "
        f"{cfg.steps} steps, {classes} classes ({origin})"
    )
    print(f"compute per step: {source}")
    ddp = next((t for m, t in rows if m == BASELINE), None)
    header = ("method", "s/step", "run s", "MB/rank", "MB/rank/step", "vs ddp")
    table = [header]
    for m, t in rows:
        speed = f"{ddp.seconds / t.seconds:.2f}x" if ddp else "—"
        table.append(
            (
                m,
                f"{t.mean_step_seconds:.3f}",
                f"{t.seconds:.1f}",
                f"{t.plan.inter_bytes / 1e6:.1f}",
                f"{t.plan.per_step / 1e6:.3f}",
                speed,
            )
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for r in table:
        print(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))
            )
        )
    for m, why in skipped.items():
        print(f"skipped {m}: {why}")
    best, t = min(rows, key=lambda x: x[1].seconds)
    vs = f", {ddp.seconds / t.seconds:.2f}x the speed of ddp" if ddp and best != BASELINE else ""
    print(f"recommended: {best} (the fastest predicted run{vs})")
    print(
        "s/step: mean over the run, syncs included; run s: the steps and syncs (start-up, "
        "evaluation and checkpoints not counted); MB: inter-node bytes per rank. "
        f"A step = its compute + its node's bytes over the link, no overlap. The "
        f"recommendation {PLAN_ASSUMES}."
    )
    return 0
