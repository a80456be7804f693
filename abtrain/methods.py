"""The training methods as small objects: how gradients travel, whether AB phases run.

All share one trainer; a method only answers the questions on which they differ.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

from abtrain import groups
from abtrain.config import Config
from abtrain.ledger import Ledger


class DDP:
    """Plain data parallelism: every step all-reduces every gradient over the world."""

    low_rank = False
    # Re-wrapping at checkpoints gives a resumed run the same DDP bucket layout as an
    # uninterrupted one, which keeps resume bitwise exact.
    rewrap_at_checkpoint = True

    def comm_hook(self, cfg: Config, ledger: Ledger, group: dist.ProcessGroup) -> tuple[Any, Any]:
        return None, ledger.allreduce_hook(group)

    def bucket_cap_mb(self, cfg: Config, backend: str) -> float:
        return cfg.dist.bucket_cap_mb

    def group_plan(self, world_size: int, group_size: int) -> list[tuple[list[int], str]]:
        raise NotImplementedError


class PowerSGD(DDP):
    """DDP with torch's PowerSGD hook (rank-r gradient compression with error feedback)."""

    # Its error memory is keyed by bucket; a new wrapper would misalign it.
    rewrap_at_checkpoint = False

    def __init__(self) -> None:
        self.state: powerSGD_hook.PowerSGDState | None = None

    def comm_hook(self, cfg: Config, ledger: Ledger, group: dist.ProcessGroup) -> tuple[Any, Any]:
        counting = ledger.counting_dist()
        powerSGD_hook.dist = counting  # its all-reduces come from future callbacks
        default_hooks.dist = counting  # its first iterations use the plain all-reduce
        if self.state is None:
            p = cfg.powersgd
            self.state = powerSGD_hook.PowerSGDState(
                process_group=group,
                matrix_approximation_rank=p.rank,
                start_powerSGD_iter=p.start_iter,
                use_error_feedback=p.error_feedback,
                warm_start=p.warm_start,
                random_seed=cfg.seed,
            )
        return self.state, powerSGD_hook.powerSGD_hook

    def bucket_cap_mb(self, cfg: Config, backend: str) -> float:
        # PowerSGD issues its later all-reduces from future callbacks; with several buckets
        # ranks may issue them in different orders, which gloo can't match
        # ("Received data size doesn't match"). One bucket keeps a single order.
        return 1e6 if backend == "gloo" else cfg.dist.bucket_cap_mb


class AB(DDP):
    """AB training: groups train A or B independently between world-wide syncs."""

    low_rank = True

    def __init__(self, all_train_b: bool = False) -> None:
        self.all_train_b = all_train_b

    def group_plan(self, world_size: int, group_size: int) -> list[tuple[list[int], str]]:
        return groups.plan(world_size, group_size, all_train_b=self.all_train_b)


class ABPowerSGD(AB):
    """AB training whose full-rank steps (warm-up and rebounds) send PowerSGD-compressed
    gradients over the world; AB phases stay inside their groups, uncompressed.

    One PowerSGD state lives through the run, so its first `start_iter` full-rank steps
    (in the warm-up) are uncompressed and every later one is compressed, and its
    warm-start factors (an initial guess for the power iteration, harmless when stale)
    carry from one rebound to the next. Its error feedback does not: the residual is
    gradient that was never applied to a W the sync has since replaced by the average of
    the groups' A·B, so it is dropped at each sync."""

    rewrap_at_checkpoint = False  # PowerSGD's memory is keyed by bucket

    def __init__(self) -> None:
        super().__init__()
        self.powersgd = PowerSGD()

    def comm_hook(self, cfg: Config, ledger: Ledger, group: dist.ProcessGroup) -> tuple[Any, Any]:
        if group is not None:  # an AB phase: DDP inside the group
            return super().comm_hook(cfg, ledger, group)
        if self.powersgd.state is not None:  # a rebound: the first wrap after a sync
            self.powersgd.state.error_dict.clear()
        return self.powersgd.comm_hook(cfg, ledger, group)

    def bucket_cap_mb(self, cfg: Config, backend: str) -> float:
        return self.powersgd.bucket_cap_mb(cfg, backend)


def make(name: str) -> DDP:
    return {
        "ddp": DDP,
        "powersgd": PowerSGD,
        "ab": AB,
        "ab_individual": AB,
        "ab_nogroups": lambda: AB(all_train_b=True),
        "ab_powersgd": ABPowerSGD,
    }[name]()
