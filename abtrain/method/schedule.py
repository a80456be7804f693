"""Which phase step t is in, and its learning rate. Pure functions of the step.

A method with AB phases: `warmup_steps` full-rank steps, then cycles of `ab_steps` low-rank
steps and `rebound_steps` full-rank steps until `steps`. Local SGD and DiLoCo: `warmup_steps`
of DDP over the world, then local phases of `period` steps, each node on its own, with an
average across nodes between two of them. Others are full-rank throughout.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from abtrain.config import ABConfig, Config, MethodConfig
from abtrain.method import methods

PHASE_IDS = {"full": 0, "warmup": 1, "ab": 2, "rebound": 3, "local": 4}


@dataclass(frozen=True)
class Phase:
    kind: str  # full | warmup | ab | rebound | local
    cycle: int = -1  # index of the AB cycle or local phase, -1 outside them

    @property
    def low_rank(self) -> bool:
        return self.kind == "ab"

    @property
    def grouped(self) -> bool:
        """Each group (a node) trains on its own: the replicas differ until its end, when
        they are averaged across groups."""
        return self.kind in ("ab", "local")


def phase_at(step: int, cfg: MethodConfig) -> Phase:
    return _phase_and_start(step, cfg)[0]


def _phase_and_start(step: int, cfg: MethodConfig) -> tuple[Phase, int]:
    """The phase of `step` and the step it began at.

    `algorithm1` (the paper's): cycles of `ab_steps` AB then `rebound_steps` full-rank steps
    from the end of the warm-up. `authors` (their code, c3dbc10): a sync at every multiple
    of the period S = ab_steps + rebound_steps, each followed by R = `rebound_steps`
    full-rank steps; the first AB phase runs from the warm-up's end W to the first multiple
    after it. Their switch back to AB fires at every step t > S with t mod S = R; when it
    falls inside that first AB phase (0 <= W mod S < R, W >= S) it changes nothing but
    restarts the LR ramp (and re-wraps DDP inside the group), so that step is returned as
    the phase's start.
    """
    kind = methods.kind(cfg.method)
    if kind.local and not follows_ab(cfg):
        local = kind().settings(cfg)
        if step < local.warmup_steps:
            return Phase("warmup"), 0
        cycle = (step - local.warmup_steps) // local.period
        return Phase("local", cycle), local.warmup_steps + cycle * local.period
    if not kind.low_rank and not kind.local:
        return Phase("full"), 0
    phase, start = _ab_phase_and_start(step, cfg.ab)
    if kind.local and phase.kind == "ab":  # the matched ablation: no factorisation
        return Phase("local", phase.cycle), start
    return phase, start


def follows_ab(cfg: MethodConfig) -> bool:
    """Whether the method's phases are AB's (`ab.*`): an AB method's, and local SGD's under
    `localsgd.schedule: ab` (AB's schedule, its LR rebounds included, with a local phase,
    the full model trained inside each node, in place of each AB phase)."""
    kind = methods.kind(cfg.method)
    return kind.low_rank or (cfg.method == "localsgd" and cfg.localsgd.schedule == "ab")


def _ab_phase_and_start(step: int, ab: ABConfig) -> tuple[Phase, int]:
    if step < ab.warmup_steps:
        return Phase("warmup"), 0
    period = ab.ab_steps + ab.rebound_steps
    if ab.phase_rule == "algorithm1":
        cycle, within = divmod(step - ab.warmup_steps, period)
        start = ab.warmup_steps + cycle * period
        if within < ab.ab_steps:
            return Phase("ab", cycle), start
        return Phase("rebound", cycle), start + ab.ab_steps
    first_sync = (ab.warmup_steps // period + 1) * period
    if step < first_sync:
        again = first_sync - period + ab.rebound_steps  # their switch to AB in this period
        if ab.warmup_steps < again <= step and again > period:
            return Phase("ab", 0), again
        return Phase("ab", 0), ab.warmup_steps
    cycle, within = divmod(step - first_sync, period)
    start = first_sync + cycle * period
    if within < ab.rebound_steps:
        return Phase("rebound", cycle), start
    return Phase("ab", cycle + 1), start + ab.rebound_steps


def merged_at(step: int, cfg: MethodConfig) -> bool:
    """Whether every rank holds the same model as `step` begins, so an evaluation scores the
    run's model and not one replica: not in an AB phase, and in a local phase only at its
    first step (the nodes just averaged, or the warm-up just ended)."""
    phase, start = _phase_and_start(step, cfg)
    return not phase.low_rank and (phase.kind != "local" or step == start)


def phases(cfg: MethodConfig) -> list[tuple[int, Phase]]:
    """(first step, phase) of every phase of the run, in order."""
    out: list[tuple[int, Phase]] = []
    for step in range(cfg.steps):
        phase = phase_at(step, cfg)
        if not out or out[-1][1] != phase:
            out.append((step, phase))
    return out


def last_change(step: int, cfg: MethodConfig) -> int | None:
    """The latest step <= `step` at which the representation changed (None: not yet)."""
    if not follows_ab(cfg) or step < cfg.ab.warmup_steps:
        return None
    return _phase_and_start(step, cfg)[1]


def scheduled_lr(step: int, cfg: Config) -> float:
    """`optim.schedule` at `step`. abtrain: a linear warm-up to `lr` from lr/(W+1), then
    cosine down to `min_lr` at the last step. authors: timm's CosineLRScheduler as the
    authors' trainer ran it (warm-up from min_lr over W steps, cosine over the steps after
    it, stepped once per update), whose first step runs at the peak `lr`: their trainer
    replaces the optimizer's param groups after the scheduler wrote the warm-up's first LR
    into them, and the scheduler sets the next one only after that step."""
    o = cfg.optim
    w = o.lr_warmup_steps
    if o.schedule == "authors":
        if step == 0:
            return o.lr
        if step < w:
            return o.min_lr + step * (o.lr - o.min_lr) / w
        progress = (step - w) / max(1, cfg.steps - w)
    else:
        if step < w:
            return o.lr * (step + 1) / (w + 1)
        progress = (step - w) / max(1, cfg.steps - 1 - w)
    return o.min_lr + (o.lr - o.min_lr) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


AUTHORS_REBOUND_FLOOR = 1e-5  # the LR the authors' rebound sets at a change (hard-coded there)


def rebound_lr(step: int, cfg: MethodConfig, base: Callable[[int], float]) -> float:
    """The LR at `step` under the rebound after each change of representation, `base` the
    schedule (a function of the step). abtrain (`ab.lr_rebound`): `base` times a ramp
    (i+1)/(N+1) over the N = `lr_rebound_steps` steps i = 0.. after the change. authors:
    their min(base, f·i) for i = 1..N from the change's step, f = (base at the change -
    1e-5)/N, the first step at min(1e-5, f): the ramp sets the LR itself, toward the
    schedule's value at the change, and the schedule only caps it."""
    start, n = last_change(step, cfg), cfg.ab.lr_rebound_steps
    if start is None or step - start >= n:
        return base(step)
    if cfg.ab.lr_rebound == "abtrain":  # (the factor first: the same float as ever)
        return base(step) * ((step - start + 1) / (n + 1))
    i, f = step - start + 1, (base(start) - AUTHORS_REBOUND_FLOOR) / n
    return min(AUTHORS_REBOUND_FLOOR, f) if i == 1 else min(base(step), f * i)


def rebound_factor(step: int, cfg: MethodConfig) -> float:
    """abtrain's rebound as a factor of the schedule: a ramp from 1/(N+1) over
    `lr_rebound_steps` after each change of representation (1 elsewhere)."""
    return rebound_lr(step, cfg, lambda _: 1.0)


def lr_at(step: int, cfg: Config) -> float:
    """The LR of `step`: the schedule, and the rebound over it (`rebound_lr`)."""
    return rebound_lr(step, cfg, lambda t: scheduled_lr(t, cfg))


def decay_left(cfg: Config) -> float:
    """What AdamW's decoupled weight decay alone leaves of a weight over the whole run,
    exp(−wd·Σlr): the factor by which a singular value that no gradient supports shrinks.
    Under the ortho-σ init every σ starts at 1, so a rank falls below `sigma_cutoff`·σ_max
    by decay alone only where this is below the cutoff."""
    lr_sum = sum(lr_at(step, cfg) for step in range(cfg.steps))
    return math.exp(-cfg.optim.weight_decay * lr_sum)
