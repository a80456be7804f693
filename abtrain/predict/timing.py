"""The time model: how long a run's steps take over a given link, without training it.

A step is its compute (measured: a file of per-phase seconds, or a bench.network run's; or
stated: FLOPs at a share of a GPU's peak) plus its node's bytes over the link, no overlap
(`Timing`, `timing`); a method's time to a target accuracy is its unshaped run's time to
the step where it reached it plus what the link adds before it (`ToTarget`). One model for
`abtrain plan`, the benchmark's figures (bench.rates) and the report; within MODEL_ERROR
of every committed bench.network run."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from abtrain import models
from abtrain.config import Config, ConfigError
from abtrain.predict.traffic import Estimate, estimate


# ---------------------------------------------------------------- time and rate
@dataclass
class Timing:
    """A run's predicted time: per-step seconds by phase kind, the syncs, and the rate."""

    traffic: Estimate
    step_seconds: dict[str, float]
    sync_seconds: float  # one sync, its bytes and its local work
    seconds: float  # the whole run: steps and syncs (not start-up, evaluation, saving)

    @property
    def mean_step_seconds(self) -> float:
        return self.seconds / self.traffic.total_steps

    @property
    def gb_per_s(self) -> float:
        """Inter-node GB/s per process over the run, the paper's Table 1 quantity."""
        return self.traffic.inter_bytes / self.seconds / 1e9


def timing(
    p: Estimate,
    ranks_per_node: int,
    compute: dict[str, float],
    link_bytes_per_s: float | None,
) -> Timing:
    """The stated time model: a step takes its compute time plus the time its node's
    inter-node bytes take over the node's link, with no overlap between the two.

    `compute`: seconds of a step without the network by phase kind (missing kinds take
    'full'; a 'sync' entry is a sync's local work: SVDs, merges), measured on the
    user's hardware or given. `link_bytes_per_s`: one node's link, each direction; None
    for a network that costs nothing. A node's ranks share its link: in a ring over
    contiguous ranks one edge leaves each node, and carries `ranks_per_node` times the
    per-rank mean the ledger and the plan count."""

    def wire(nbytes: float) -> float:
        return 0.0 if link_bytes_per_s is None else ranks_per_node * nbytes / link_bytes_per_s

    def local(kind: str) -> float:
        # PowerSGD's uncompressed first steps compute as the warm-up's (in AB methods)
        for key in (kind, "full", *(("warmup",) if kind == "uncompressed" else ())):
            if key in compute:
                return compute[key]
        raise ValueError(f"compute: no seconds for {kind!r} steps (nor for 'full' ones)")

    step = {k: local(k) + wire(b) for k, b in p.step_bytes.items()}
    sync = (compute.get("sync", 0.0) + wire(p.event_bytes["sync"] / p.syncs)) if p.syncs else 0.0
    seconds = sum(p.steps[k] * step[k] for k in p.steps) + p.syncs * sync
    return Timing(p, step, sync, seconds)


def step_flops(cfg: Config, classes: int) -> float:
    """Floating-point operations of one training step (forward and backward) of one rank's
    batch at full rank, counted by torch on the meta device."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        model = models.build(cfg, classes, getattr(cfg.data, "features", 0))
        x = torch.empty(cfg.batch_size, 3, cfg.data.image_size, cfg.data.image_size)
        with FlopCounterMode(display=False) as counter:
            model(x).sum().backward()
    return float(counter.get_total_flops())


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

        self.ranks = ranks_per_node
        self.full = estimate(cfg, nodes, ranks_per_node, classes)
        self.compute = phase_compute(self.full, free["step_seconds"])
        self.start = elapsed_at(free["evals"], target_step)
        try:  # the run cut at the target step: its phases and syncs up to there
            cut = from_dict(cfg.dump(), [f"steps={max(1, round(target_step))}"])
            self.cut, self.scale = estimate(cut, nodes, ranks_per_node, classes), 1.0
        except (ConfigError, ValueError):  # too early for the schedule: scale the run
            self.cut, self.scale = self.full, target_step / self.full.total_steps
        self.free = timing(self.cut, ranks_per_node, self.compute, None).seconds

    def step_seconds(self, link: float | None) -> float:
        """The mean step over the whole run, syncs included."""
        return timing(self.full, self.ranks, self.compute, link).mean_step_seconds

    def seconds(self, link: float | None) -> float:
        added = timing(self.cut, self.ranks, self.compute, link).seconds - self.free
        return self.start + self.scale * added


def predict(cfg, nodes: int, ranks_per_node: int, classes: int, step_seconds, link):
    """The planner's plan and timing of `cfg` on nodes x ranks_per_node over `link`."""
    p = estimate(cfg, nodes, ranks_per_node, classes)
    return timing(p, ranks_per_node, phase_compute(p, step_seconds), link)
