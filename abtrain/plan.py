"""`python -m abtrain plan`: which method pays off. Each method's expected seconds per step
and for the run on a cluster and link, predicted without training (from a compute file or a
few steps timed here), and the method it recommends."""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import sys
import tempfile
import typing
from dataclasses import dataclass, field
from pathlib import Path

from abtrain import launch
from abtrain.config import BASELINE, ConfigError, Method, load, training_diff

# abtrain.planner and abtrain.methods import torch: they are imported where used, because
# every command builds this command's parser (`python -m abtrain --help` should stay fast).

# the time model's error against the committed benchmark (tests/abtrain/test_plan_cli.py holds
# every method's time to the target within it): methods predicted closer than this are a tie
MODEL_ERROR = 0.10
PLAN_ASSUMES = (
    "assumes every method needs the same number of steps to reach a given accuracy "
    "(bench.network measures how far that holds: bench/results/network-rates.json)"
)
PLAN_TO_TARGET = (
    "ranks by predicted time to the target top-1: the seconds each method's run in the file "
    "took to it, plus what the link adds to its steps and syncs before it (ToTarget, the "
    "time model bench.rates and the report use)"
)
PLAN_SCHEDULE = (
    "It plans with the settings the file's runs were made with (their schedule: the one "
    "their step times and steps to the target belong to); a --set that changes them "
    "leaves the time to the target out"
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
        "With a bench.network results file as --compute, which records how many steps each "
        "method took to a target top-1, the recommendation " + PLAN_TO_TARGET + "; a method "
        "that did not reach the target there is not recommended. " + PLAN_SCHEDULE + ". "
        "Otherwise it is the fastest predicted run, and it " + PLAN_ASSUMES + ".",
    )
    plan.add_argument("--config", required=True)
    plan.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one config value per --set (repeat it); with a bench.network file as "
        "--compute they apply over the settings of the file's runs",
    )
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
        "or a bench.network results file (its step_seconds, and its steps to the target "
        "top-1; planned with the settings its runs were made with, each method with its "
        "own; take the unshaped one)",
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


@dataclass
class Compute:
    """What `plan` times each method from: per-phase compute seconds per step, where they
    come from, and, from a bench.network results file, the settings its runs used and the
    steps each took to the file's target top-1 (None: it did not reach it)."""

    seconds: dict[str, dict[str, float]]
    source: str
    overrides: list[str] = field(default_factory=list)
    method_overrides: dict[str, list[str]] = field(default_factory=dict)
    target_top1: float | None = None
    steps_to_target: dict[str, float | None] = field(default_factory=dict)
    runs: dict[str, dict] = field(default_factory=dict)  # the file's runs: evals, step times
    rate: str | None = None  # the link the file's runs were made over


def read_bench(path: str, raw: dict) -> Compute:
    """A bench.network results file: each result's step_seconds and, where it has them, its
    target top-1 and steps to it."""
    try:
        out = {r["method"]: dict(r["step_seconds"]) for r in raw["results"]}
        reached = {
            r["method"]: r["steps_to_target"] for r in raw["results"] if "steps_to_target" in r
        }
        targets = {r["target_top1"] for r in raw["results"] if "target_top1" in r}
    except (KeyError, TypeError) as err:
        raise ConfigError(f"--compute {path}: a result lacks {err}") from None
    if len(targets) > 1:
        raise ConfigError(f"--compute {path}: its results have different targets {targets}")
    shape = f"{raw.get('nodes')}x{raw.get('ranks_per_node')}"
    what = f"bench.network run at {shape} ranks, link {raw.get('rate')}"
    if raw.get("rate") not in ("unshaped", None):
        what += "; a shaped run's step times hold network time already"
    target = targets.pop() if targets and reached else None
    return Compute(
        out,
        f"{path} ({what})",
        list(raw.get("overrides", [])),
        {m: list(v) for m, v in raw.get("method_overrides", {}).items()},
        target,
        reached if target is not None else {},
        {r["method"]: r for r in raw["results"]},
        raw.get("rate"),
    )


def read_compute(path: str) -> Compute:
    """Per-method per-phase compute seconds from FILE: a mapping method -> {phase: s}, or
    a bench.network results file (each result's step_seconds and steps to its target)."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"--compute {path}: {err}") from None
    if isinstance(raw, dict) and isinstance(raw.get("results"), list):
        return read_bench(path, raw)
    ok = isinstance(raw, dict) and all(
        isinstance(v, dict) and all(isinstance(x, int | float) for x in v.values())
        for v in raw.values()
    )
    if not ok:
        raise ConfigError(
            f"--compute {path}: expected {{method: {{phase: seconds}}}} or a bench.network "
            "results file"
        )
    return Compute({m: {k: float(x) for k, x in v.items()} for m, v in raw.items()}, path)


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


def elapsed_at(evals: list[dict], step: float) -> float:
    """A run's training seconds at `step`, interpolated over its evaluations (from 0 at
    step 0); past the last one, at the last segment's pace."""
    pts = [(0.0, 0.0), *((float(e["step"]), float(e["seconds"])) for e in evals)]
    for (s0, t0), (s1, t1) in zip(pts, pts[1:]):
        if step <= s1 and s1 > s0:
            return t0 + (step - s0) / (s1 - s0) * (t1 - t0)
    (s0, t0), (s1, t1) = pts[-2], pts[-1]
    return t1 + (step - s1) * (t1 - t0) / (s1 - s0)


class ToTarget:
    """The time model of time to a target accuracy, the one `plan`, bench.rates and the report
    use: a run made without network cost (one of bench.network's unshaped runs) took
    `elapsed_at(target_step)` seconds to the step where it reached the target (its
    evaluations, syncs and phase changes included); a link adds to that what the planner's
    `timing` adds over it to the steps and syncs before that step (the plan of the run cut
    there). Training is the same at every rate (gloo and the data order are deterministic),
    so the target step is too. `cfg`: the settings that run was made with (the target step
    is a step of its schedule)."""

    def __init__(
        self, cfg, nodes: int, ranks_per_node: int, classes: int, free: dict, target_step: float
    ) -> None:
        from abtrain.config import from_dict
        from abtrain.planner import plan, timing

        self.ranks = ranks_per_node
        self.full = plan(cfg, nodes, ranks_per_node, classes)
        self.compute = phase_compute(self.full, free["step_seconds"])
        self.start = elapsed_at(free["evals"], target_step)
        try:  # the run cut at the target step: its phases and syncs up to there
            cut = from_dict(cfg.dump(), [f"steps={max(1, round(target_step))}"])
            self.cut, self.scale = plan(cut, nodes, ranks_per_node, classes), 1.0
        except (ConfigError, ValueError):  # too early for the schedule: scale the run
            self.cut, self.scale = self.full, target_step / self.full.total_steps
        self.free = timing(self.cut, ranks_per_node, self.compute, None).seconds

    def step_seconds(self, link: float | None) -> float:
        """The mean step over the whole run, syncs included."""
        from abtrain.planner import timing

        return timing(self.full, self.ranks, self.compute, link).mean_step_seconds

    def seconds(self, link: float | None) -> float:
        from abtrain.planner import timing

        added = timing(self.cut, self.ranks, self.compute, link).seconds - self.free
        return self.start + self.scale * added


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
        given = read_compute(args.compute) if args.compute else None
        # A bench.network file's step times and steps to the target belong to its runs'
        # schedule: plan that one (the user's --set come after and win), not the config's.
        base = given.overrides if given else []
        cfg = load(args.config, [*base, *args.overrides])
        classes, origin = (args.classes, "--classes") if args.classes else data_classes(cfg)
        cfgs, skipped, changed = {}, {}, set()
        for m in methods:
            # a method the file's run trained with settings of its own is planned with them
            own = given.method_overrides.get(m, []) if given else []
            try:
                c = load(args.config, [*base, *args.overrides, f"method={m}", *own])
                check_world(c, args.nodes * args.ranks_per_node, args.ranks_per_node)
                cfgs[m] = c
                if given and given.target_top1 is not None:
                    ran = load(args.config, [*base, f"method={m}", *own])
                    old, new = ran.dump(), c.dump()
                    changed |= {
                        f"{k}={value_at(new, k)} (the runs': {value_at(old, k)})"
                        for k in training_diff(old, new)
                    }
            except ConfigError as err:
                skipped[m] = str(err).splitlines()[-1].strip()
        if given:
            compute = given
            shape = f"at {args.nodes}x{args.ranks_per_node} ranks"
            if " ranks, link" in compute.source and shape not in compute.source:
                compute.source += f"; applied {shape}"
        else:
            seconds = measure_compute(
                args.config, args.overrides, list(cfgs), args.nodes, args.ranks_per_node
            )
            compute = Compute(seconds, f"measured here, {args.nodes}x{args.ranks_per_node} ranks")
        rows = []
        for m, c in cfgs.items():
            if m not in compute.seconds:
                skipped[m] = f"no compute times for it in {args.compute}"
                continue
            t = predict(c, args.nodes, args.ranks_per_node, classes, compute.seconds[m], link)
            rows.append((m, t))
        to_target = target_seconds(args, cfgs, classes, compute, link, bool(changed))
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
    print(f"compute per step: {compute.source}")
    print_settings(args, compute, [m for m, _ in rows], sorted(changed))
    print_table(rows, to_target)
    for m, why in skipped.items():
        print(f"skipped {m}: {why}")
    recommend(args, rows, compute, to_target)
    print(
        "s/step: mean over the run, syncs included; run s: the steps and syncs (start-up, "
        "evaluation and checkpoints not counted); MB: inter-node bytes per rank"
        + (
            "; to target s: the file's run's seconds to the target (evaluations included) "
            "plus what the link adds to the steps and syncs before it"
            if to_target
            else ""
        )
        + ". A step = its compute + its node's bytes over the link, no overlap."
    )
    return 0


def value_at(d: dict, dotted: str) -> object:
    """A nested dict's value at a dotted key (None where it has none)."""
    for key in dotted.split("."):
        d = d.get(key) if isinstance(d, dict) else None
    return d


def pasteable(sets: list[str]) -> str:
    """KEY=VALUE overrides as `--set` flags a shell reads back as they are."""
    return " ".join(f"--set {shlex.quote(o)}" for o in sets)


def print_settings(args, compute: Compute, planned: list[str], changed: list[str]) -> None:
    """The settings the plan took from the file's runs (their compute times and steps to the
    target belong to those), as flags to paste; and what the user's --set changed of them."""
    if compute.overrides:
        print(f"planned with {args.compute}'s runs' settings: {pasteable(compute.overrides)}")
    for m, own in compute.method_overrides.items():
        if own and m in planned:
            print(f"{m}: planned with its run's own settings too: {pasteable(own)}")
    if changed:
        print(
            f"note: --set changes {', '.join(changed)} of {args.compute}'s runs: their steps "
            "to the target do not carry over, so no time to the target is predicted "
            "(leave those --set out for it)"
        )


def target_seconds(
    args, cfgs: dict, classes: int, compute: Compute, link: float | None, changed: bool = False
) -> dict[str, float | None]:
    """Each method's predicted seconds to the file's target top-1 (ToTarget over the file's
    run of it); None where that run did not reach it. Empty when the compute source says
    nothing about accuracy, or when the plan `changed` the settings of the file's runs (their
    steps to the target say nothing about other settings)."""
    if compute.target_top1 is None:
        return {}
    if compute.rate not in ("unshaped", None):
        raise ConfigError(
            f"--compute {args.compute}: its runs were made over a {compute.rate} link, whose "
            "time their seconds to the target hold; give the unshaped run's file "
            "(bench/results/network-unshaped.json)"
        )
    if changed:
        return {}
    out: dict[str, float | None] = {}
    for m, cfg in cfgs.items():
        steps = compute.steps_to_target.get(m)
        if m not in compute.runs:
            continue
        out[m] = (
            None
            if steps is None
            else ToTarget(
                cfg, args.nodes, args.ranks_per_node, classes, compute.runs[m], steps
            ).seconds(link)
        )
    return out


def print_table(rows: list, to_target: dict[str, float | None]) -> None:
    ddp = next((t for m, t in rows if m == BASELINE), None)
    header = ("method", "s/step", "run s", "MB/rank", "MB/rank/step", "vs ddp")
    if to_target:
        header += ("to target s",)
    table = [header]
    for m, t in rows:
        speed = f"{ddp.seconds / t.seconds:.2f}x" if ddp else "—"
        row = (
            m,
            f"{t.mean_step_seconds:.3f}",
            f"{t.seconds:.1f}",
            f"{t.plan.inter_bytes / 1e6:.1f}",
            f"{t.plan.per_step / 1e6:.3f}",
            speed,
        )
        if to_target:
            got = to_target.get(m)
            row += ("not reached" if got is None else f"{got:.1f}",)
        table.append(row)
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for r in table:
        print(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))
            )
        )


def recommend(args, rows: list, compute: Compute, to_target: dict[str, float | None]) -> None:
    """The recommendation line: first to the target where the file says how many steps each
    method took to it, the fastest run otherwise (and the assumption that takes)."""
    runs = {m: t.seconds for m, t in rows}
    fastest = min(runs, key=runs.get)
    if not to_target:
        vs = (
            f", {runs[BASELINE] / runs[fastest]:.2f}x the speed of ddp"
            if (BASELINE in runs and fastest != BASELINE)
            else ""
        )
        print(f"recommended: {fastest} (the fastest predicted run{vs}; it {PLAN_ASSUMES})")
        return
    target = f"{compute.target_top1:g}% top-1"
    for m, seconds in to_target.items():
        if seconds is None:
            print(
                f"not recommended: {m}: did not reach the target {target} in {args.compute}'s run"
            )
    reached = {m: s for m, s in to_target.items() if s is not None}
    if not reached:
        print(f"recommended: none (no planned method reached {target} in {args.compute}'s run)")
        return
    best = min(reached, key=reached.get)
    vs = (
        f", {reached[BASELINE] / reached[best]:.2f}x the speed of ddp to it"
        if (BASELINE in reached and best != BASELINE)
        else ""
    )
    print(
        f"recommended: {best} (the first predicted to reach {target}{vs}; time to the target: "
        f"its run's in {args.compute} plus what the link adds)"
    )
    close = {m: s / reached[best] - 1 for m, s in reached.items() if m != best}
    close = {m: d for m, d in close.items() if d < MODEL_ERROR}
    if close:
        print(
            "too close to tell: "
            + ", ".join(f"{m} (+{d:.1%})" for m, d in sorted(close.items(), key=lambda x: x[1]))
            + f" within the time model's ±{MODEL_ERROR:.0%} of it: either may come first"
        )
    if fastest != best:
        steps = compute.steps_to_target
        took = (
            "did not reach it"
            if steps.get(fastest) is None
            else f"took {steps[fastest]:.0f} steps to it"
        )
        print(
            f"{fastest} has the fastest predicted run, but {took} in {args.compute}'s run, "
            f"against {steps[best]:.0f} for {best}"
        )
