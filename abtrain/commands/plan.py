"""`python -m abtrain plan`: which method pays off. Each method's expected seconds per step
and for the run on a cluster and link, predicted without training (from a compute file or a
few steps timed here), and the method it recommends."""

from __future__ import annotations

import csv
import json
import os
import shlex
import sys
import tempfile
import typing
from pathlib import Path

from abtrain.commands import localrun
from abtrain.commands.cli import PLAN_ASSUMES
from abtrain.commands.preflight import data_classes
from abtrain.config import BASELINE, ConfigError, Method, load, training_diff
from abtrain.predict import MODEL_ERROR
from abtrain.predict.timing import (
    Compute,
    ToTarget,
    link_bytes_per_s,
    predict,
    read_compute,
)

# (abtrain.commands.cli holds this command's arguments, so `python -m abtrain --help` stays quick
# while this module imports the time model, and torch with it.)

# the schedule of a --measure run: every phase kind and two syncs in a few steps
MEASURE_RUN_SETS = [
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
                x for o in [*overrides, *MEASURE_RUN_SETS, f"method={method}"] for x in ("--set", o)
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
                    code = localrun.run_local(nodes, ranks_per_node, args)
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
    from abtrain.method.methods import check_world, unread_sections

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
                # (what it changed of the file's runs: of the methods the file has run)
                if given and given.target_top1 is not None and m in given.seconds:
                    ran = load(args.config, [*base, f"method={m}", *own])
                    old, new = ran.dump(), c.dump()
                    changed |= {
                        f"{k}={value_at(new, k)} (the runs': {value_at(old, k)})"
                        for k in training_diff(old, new)
                        if k.split(".")[0] not in unread_sections(m)
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
    from abtrain.method.methods import unread_sections

    for m, own in compute.method_overrides.items():
        own = [o for o in own if o.partition("=")[0].split(".")[0] not in unread_sections(m)]
        if own and m in planned:  # (only those the method reads: DDP's no ab.*)
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
            f"{t.traffic.inter_bytes / 1e6:.1f}",
            f"{t.traffic.per_step / 1e6:.3f}",
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
