"""`python -m abtrain train --config FILE [--set key=value ...] --out DIR` (under torchrun);
`check`, `prepare`, `compare`, and `plan` (which method pays off on a given cluster and link,
predicted without training)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m abtrain")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train one run (launch with torchrun)")
    train.add_argument(
        "--config", required=True, help="YAML file; params.yaml is read from its `train` section"
    )
    train.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    train.add_argument("--out", required=True, help="run folder: summary, ledger, checkpoints")
    check = sub.add_parser("check", help="validate a config (and a world size) without training")
    check.add_argument("--config", required=True)
    check.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    check.add_argument(
        "--world-size", type=int, default=None, help="default: the fewest ranks the method runs on"
    )
    check.add_argument(
        "--ranks-per-node", type=int, default=None, help="default: all ranks on one node"
    )
    prep = sub.add_parser(
        "prepare", help="verify the config's data set and write its prepared form"
    )
    prep.add_argument("--config", required=True)
    prep.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    compare = sub.add_parser("compare", help="table of finished runs; traffic relative to ddp")
    compare.add_argument("runs", nargs="+", help="run folders holding summary.json")
    _plan_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "compare":
        return _compare(args.runs)
    if args.command == "plan":
        return _plan(args)

    from abtrain.config import ConfigError, check_world, load

    try:
        cfg = load(args.config, args.overrides)
        if args.command == "prepare":
            return _prepare(cfg)
        if args.command == "check":
            return _check(cfg, args.config, args.world_size, args.ranks_per_node)
        from abtrain.launch import die_with_parent
        from abtrain.trainer import Launch

        if "TORCHELASTIC_RUN_ID" in os.environ:  # under torchrun: go when it goes
            die_with_parent(signal.SIGKILL)
        launch = Launch.from_env()
        check_world(cfg, launch.world_size, launch.ranks_per_node)
        check_batch(cfg, launch.world_size)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return _train(cfg, args.out, launch)


def smallest_world(cfg, ranks_per_node: int | None) -> tuple[int, int]:
    """(world size, ranks per node) of the fewest ranks `cfg` runs on: an AB method needs
    an A and a B group, of ab.group_size ranks or (group_size null) one node each."""
    from abtrain.config import AB_METHODS

    if cfg.method not in AB_METHODS:
        return 1, 1
    if cfg.method == "ab_nogroups":  # one group of the world, or groups of ab.group_size
        size = cfg.ab.group_size or 1
        return size, ranks_per_node or size
    if cfg.method == "ab_individual":
        return 2, ranks_per_node or 2
    if cfg.ab.group_size is None:
        return 2 * (ranks_per_node or 1), ranks_per_node or 1
    return 2 * cfg.ab.group_size, ranks_per_node or 2 * cfg.ab.group_size


def check_batch(cfg, world_size: int) -> list[str]:
    """Refuse a global batch larger than the training set; returns notes for the user."""
    from abtrain.config import ConfigError

    if cfg.data.name == "synthetic":
        n, origin = cfg.data.train_samples, "data.train_samples"
    else:
        from abtrain.data import train_size

        n, origin = train_size(cfg.data)
    if n is None:
        return [f"batch_size not checked against the training set: {origin} (run prepare)"]
    if cfg.batch_size * world_size > n:
        raise ConfigError(
            f"batch_size={cfg.batch_size} on {world_size} ranks is a global batch of "
            f"{cfg.batch_size * world_size}, more than the {n} training samples ({origin})"
        )
    return []


def _check(cfg, path: str, world_size: int | None, ranks_per_node: int | None) -> int:
    from abtrain.config import ConfigError, check_world

    notes = []
    if world_size is None:
        world_size, ranks_per_node = smallest_world(cfg, ranks_per_node)
        notes.append(
            f"no --world-size: checked on the fewest ranks {cfg.method} runs on, "
            f"{world_size // ranks_per_node} node(s) x {ranks_per_node}; "
            "pass --world-size N --ranks-per-node M to check a cluster"
        )
    elif ranks_per_node is None:
        ranks_per_node = world_size
        notes.append(f"no --ranks-per-node: checked as one node of {world_size} ranks")
    try:
        check_world(cfg, world_size, ranks_per_node)
    except ConfigError as err:
        raise ConfigError(f"{err} ({'; '.join(notes)})" if notes else str(err)) from None
    notes += check_batch(cfg, world_size)
    print(f"{path}: valid ({cfg.method}, {world_size} ranks)")
    for note in notes:
        print(f"note: {note}")
    return 0


def _train(cfg, out: str, launch) -> int:
    import torch.distributed as dist

    from abtrain.trainer import StopForRequeue, Trainer

    try:
        summary = Trainer(cfg, out, launch).run()
    except StopForRequeue as err:
        if launch.rank == 0:
            print(f"[abtrain] {err}", flush=True)
        return 0  # not a failure: DIR/REQUEUE tells the batch script to requeue the job
    except Exception as err:
        # Name this rank: with several ranks failing together, the first line tells which
        # one saw what (a peer that died shows up as a closed connection or a timeout).
        print(
            f"[abtrain] rank {launch.rank} (node {launch.node}) failed: {type(err).__name__}: {err}",
            file=sys.stderr,
            flush=True,
        )
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if launch.rank == 0:
        t = summary["traffic"]
        print(
            f"[abtrain] done: val top1 {summary['val_top1']['final']:.2f}%, "
            f"inter-node {t['inter_node_bytes'] / 1e6:.2f} MB/rank, "
            f"summary in {os.path.join(out, 'summary.json')}"
        )
    return 0


def _prepare(cfg) -> int:
    from abtrain.data import DataError, prepare

    if cfg.data.name == "synthetic":
        print("data.name is synthetic: nothing to prepare")
        return 0
    try:
        meta = prepare(cfg.data)
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for split, counts in meta["counts"].items():
        print(
            f"{split}: {sum(counts.values())} images in {len(counts)} classes "
            f"({min(counts.values())}-{max(counts.values())} per class)"
        )
    print(f"prepared in {cfg.data.prepared} ({'tensor cache' if meta['cached'] else 'file index'})")
    return 0


def _compare_row(folder: Path) -> dict:
    """One finished run: its summary, with what older summaries lack (the batch per rank,
    model and data) read from the run's config.json."""
    import json

    s = json.loads((folder / "summary.json").read_text())
    config = folder / "config.json"
    cfg = json.loads(config.read_text()) if config.exists() else {}
    batch = s.get("batch_size", cfg.get("batch_size"))
    if batch is None:
        raise ValueError("neither summary.json nor config.json gives batch_size")
    world, nodes = s["world_size"], s["nodes"]
    return dict(
        name=folder.name or str(folder),
        method=s["method"],
        scale=f"{nodes}x{world // nodes}",
        batch=f"{batch}/{s.get('global_batch', batch * world)}",
        top1=s["val_top1"]["best"],
        compression=s.get("compression_ratio"),
        mb=s["traffic"]["inter_node_bytes"] / s["steps"] / 1e6,
        # a ddp run is the baseline of the runs that share all of these
        key=(
            cfg.get("model", {}).get("name", s.get("run", {}).get("model")),
            cfg.get("data", {}).get("name", s.get("run", {}).get("data")),
            nodes,
            world,
            batch,
        ),
    )


def _compare(runs: list[str]) -> int:
    """Table of finished runs; each run's traffic against the ddp run of its own model, data,
    nodes, world size and batch per rank ("—" where there is none among `runs`)."""
    rows = []
    for run in runs:
        folder = Path(run)
        if not (folder / "summary.json").exists():
            print(
                f"error: {folder / 'summary.json'} does not exist (run not finished?)",
                file=sys.stderr,
            )
            return 2
        try:
            rows.append(_compare_row(folder))
        except (ValueError, KeyError, TypeError) as err:
            print(f"error: {folder}: {err}", file=sys.stderr)
            return 2
    baseline = {}
    for r in rows:
        if r["method"] == "ddp":
            baseline.setdefault(r["key"], r)
    header = (
        "run",
        "method",
        "nodes x ranks",
        "batch/rank / global",
        "best top-1",
        "compr.",
        "inter-node MB/step/rank",
        "vs ddp",
    )
    table = [header]
    for r in rows:
        # a ddp row is its own baseline: another seed of the same scale still reads 1.000
        base = r if r["method"] == "ddp" else baseline.get(r["key"])
        table.append(
            (
                r["name"],
                r["method"],
                r["scale"],
                r["batch"],
                f"{r['top1']:.2f}%",
                "—" if r["compression"] is None else f"{r['compression']:.2f}",
                f"{r['mb']:.3f}",
                f"{r['mb'] / base['mb']:.3f}" if base and base["mb"] else "—",
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        cells = [c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))]
        print("  ".join(cells).rstrip())
    return 0


# ---------------------------------------------------------------- plan: which method pays off
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


def _plan_parser(sub) -> None:
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
    import re

    from abtrain.config import ConfigError

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
    import json

    from abtrain.config import ConfigError

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
    import json

    from abtrain.config import ConfigError

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
    import csv
    import json
    import tempfile

    from abtrain.config import ConfigError
    from abtrain.launch import run_local

    out: dict[str, dict[str, float]] = {}
    extra: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="abtrain-plan-") as tmp:
        for method in ["ddp", *[m for m in methods if m != "ddp"]]:
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
                    code = run_local(nodes, ranks_per_node, args)
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
            if syncs and method != "ddp":
                out[method]["sync"] = max(0.0, (extra[method] - extra["ddp"]) / syncs)
            print(f"  {', '.join(f'{k} {v:.3f} s' for k, v in out[method].items())}", flush=True)
    return {m: out[m] for m in methods if m in out}


def _plan(args) -> int:
    import typing

    from abtrain.config import ConfigError, Method, load

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
                from abtrain.config import check_world

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
    ddp = next((t for m, t in rows if m == "ddp"), None)
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
    vs = f", {ddp.seconds / t.seconds:.2f}x the speed of ddp" if ddp and best != "ddp" else ""
    print(f"recommended: {best} (the fastest predicted run{vs})")
    print(
        "s/step: mean over the run, syncs included; run s: the steps and syncs (start-up, "
        "evaluation and checkpoints not counted); MB: inter-node bytes per rank. "
        f"A step = its compute + its node's bytes over the link, no overlap. The "
        f"recommendation {PLAN_ASSUMES}."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
