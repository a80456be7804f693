"""Which phase step t is in, and its learning rate. Pure functions of the step.

AB methods: `warmup_steps` full-rank steps, then cycles of `ab_steps` low-rank steps and
`rebound_steps` full-rank steps until `steps`. DDP and PowerSGD are full-rank throughout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from abtrain.config import AB_METHODS, Config

PHASE_IDS = {"full": 0, "warmup": 1, "ab": 2, "rebound": 3}


@dataclass(frozen=True)
class Phase:
    kind: str  # full | warmup | ab | rebound
    cycle: int = -1  # index of the AB cycle, -1 outside them

    @property
    def low_rank(self) -> bool:
        return self.kind == "ab"


def phase_at(step: int, cfg: Config) -> Phase:
    if cfg.method not in AB_METHODS:
        return Phase("full")
    ab = cfg.ab
    if step < ab.warmup_steps:
        return Phase("warmup")
    cycle, within = divmod(step - ab.warmup_steps, ab.ab_steps + ab.rebound_steps)
    return Phase("ab" if within < ab.ab_steps else "rebound", cycle)


def phases(cfg: Config) -> list[tuple[int, Phase]]:
    """(first step, phase) of every phase of the run, in order."""
    out: list[tuple[int, Phase]] = []
    for step in range(cfg.steps):
        phase = phase_at(step, cfg)
        if not out or out[-1][1] != phase:
            out.append((step, phase))
    return out


def last_change(step: int, cfg: Config) -> int | None:
    """The latest step <= `step` at which the representation changed (None: not yet)."""
    if cfg.method not in AB_METHODS or step < cfg.ab.warmup_steps:
        return None
    ab = cfg.ab
    phase = phase_at(step, cfg)
    start = ab.warmup_steps + phase.cycle * (ab.ab_steps + ab.rebound_steps)
    return start if phase.low_rank else start + ab.ab_steps


def scheduled_lr(step: int, cfg: Config) -> float:
    """Linear warm-up to `lr`, then cosine down to `min_lr` at the last step."""
    o = cfg.optim
    if step < o.lr_warmup_steps:
        return o.lr * (step + 1) / (o.lr_warmup_steps + 1)
    progress = (step - o.lr_warmup_steps) / max(1, cfg.steps - 1 - o.lr_warmup_steps)
    return o.min_lr + (o.lr - o.min_lr) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def lr_at(step: int, cfg: Config) -> float:
    """The scheduled LR, ramped from near 0 over `lr_rebound_steps` after each change.

    The ramp multiplies the schedule, which keeps advancing underneath it.
    """
    lr = scheduled_lr(step, cfg)
    start, n = last_change(step, cfg), cfg.ab.lr_rebound_steps
    if start is not None and step - start < n:
        lr *= (step - start + 1) / (n + 1)
    return lr
