"""The learning-rate rebound on top of any torch LR scheduler (`ABTraining.rebound`).

Multiplying the optimizer's LR by `lr_factor(step)` after a scheduler has set it is right
for a scheduler that computes each LR from the step alone (OneCycleLR, LambdaLR), and wrong
for a chainable one (CosineAnnealingLR, ExponentialLR, StepLR...), which computes the next
LR from the optimizer's current one: every rebound factor would compound. Here the
scheduler always starts from its own last values, and the rebound is applied after it.
"""

from __future__ import annotations

from typing import Any

from abtrain.config import MethodConfig
from abtrain.method.schedule import last_change, rebound_lr


class ReboundLR:
    """`scheduler` with the rebound after each change of representation applied to every
    param group's LR. Call `step()` where the scheduler's own would be called, once per
    training step (step k's LR is set when the scheduler has been stepped k times); under
    `ab.lr_rebound: authors` the ramp is set from the scheduler's own value at the change."""

    def __init__(self, scheduler: Any, cfg: MethodConfig) -> None:
        self.scheduler, self.cfg = scheduler, cfg
        self.optimizer = scheduler.optimizer
        self.own: dict[int, list[float]] = {}  # the scheduler's LRs, at the steps a ramp reads
        self._apply()

    def step(self, *args: Any, **kwargs: Any) -> None:
        for group, lr in zip(self.optimizer.param_groups, self.scheduler.get_last_lr()):
            group["lr"] = lr  # what the scheduler set, before the rebound scaled it
        self.scheduler.step(*args, **kwargs)
        self._apply()

    def get_last_lr(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        return dict(scheduler=self.scheduler.state_dict(), own=dict(self.own))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state["scheduler"])
        self.own = {int(k): v for k, v in state["own"].items()}
        self._apply()

    def _apply(self) -> None:
        step = self.scheduler.last_epoch
        start = last_change(step, self.cfg)
        # a ramp reads the schedule at its change and at the step: keep those two alone
        self.own = {k: v for k, v in self.own.items() if k == start}
        self.own[step] = list(self.scheduler.get_last_lr())
        for i, group in enumerate(self.optimizer.param_groups):
            group["lr"] = rebound_lr(step, self.cfg, lambda t, i=i: self.own[t][i])
