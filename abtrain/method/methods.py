"""The training methods as small objects: every question on which methods differ.

All share one trainer and one planner; they ask the method, never its name. A method says
whether it has AB phases (`low_rank`), whether its nodes train on their own between
averages (`local`: local SGD, DiLoCo), whether its full-rank steps send PowerSGD-compressed
gradients (`compresses`), how its ranks form groups (the group size a world allows, the
fewest ranks it runs on, the A/B roles), and how DDP sends gradients (comm hook, buckets).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from abtrain.config import ConfigError
from abtrain.distributed import groups

# torch is imported where a hook is made, not here: the registry's questions (a method's
# phases, groups, smallest world) are asked by the pipeline's stages and the report, which
# would otherwise each import torch (a second of CPU) to read a table.
if TYPE_CHECKING:
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    from abtrain.config import Config
    from abtrain.distributed.ledger import Ledger


class DDP:
    """Plain data parallelism: every step all-reduces every gradient over the world."""

    low_rank = False  # factorises its layers and has AB phases
    local = False  # each node trains on its own between averages (local SGD, DiLoCo)
    compresses = False  # its full-rank steps send PowerSGD's factors
    # Re-wrapping at checkpoints gives a resumed run the same DDP bucket layout as an
    # uninterrupted one, which keeps resume bitwise exact.
    rewrap_at_checkpoint = True

    def group_size(self, cfg: Config, world_size: int, ranks_per_node: int) -> int:
        """The size of the groups that train one factor, checked against this world (before
        init_process_group, from the launcher's environment); the world without AB phases."""
        return world_size

    def smallest_world(self, cfg: Config, ranks_per_node: int | None) -> tuple[int, int]:
        """(world size, ranks per node) of the fewest ranks `cfg` runs on."""
        return 1, 1

    def group_roles(self, world_size: int, group_size: int) -> list[tuple[list[int], str]]:
        """The A/B groups ([] for a method without AB phases)."""
        return []

    def comm_hook(self, cfg: Config, ledger: Ledger, group: dist.ProcessGroup) -> tuple[Any, Any]:
        return None, ledger.allreduce_hook(group)

    def bucket_cap_mb(self, cfg: Config, backend: str) -> float:
        return cfg.dist.bucket_cap_mb


def _counted_powersgd_hook(ledger: Ledger) -> Callable:
    """torch's PowerSGD hook, its code as torch ships it, run with `dist` bound to a view
    that records each all-reduce in `ledger`. PowerSGD issues its all-reduces from future
    callbacks, outside any hook we could wrap, so they are counted where they are made
    rather than re-derived; torch's own modules are left untouched."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    view = ledger.counting_dist()

    def rebound(fn: Callable, **names: Any) -> Callable:
        copy = types.FunctionType(
            fn.__code__, {**fn.__globals__, **names}, fn.__name__, fn.__defaults__
        )
        copy.__kwdefaults__ = fn.__kwdefaults__
        return copy

    # its first iterations fall back to default_hooks' plain all-reduce
    fallback = types.SimpleNamespace(
        _allreduce_fut=rebound(default_hooks._allreduce_fut, dist=view)
    )
    return rebound(powerSGD_hook.powerSGD_hook, dist=view, default=fallback)


class PowerSGD(DDP):
    """DDP with torch's PowerSGD hook (rank-r gradient compression with error feedback)."""

    compresses = True
    # Its error memory is keyed by bucket; a new wrapper would misalign it.
    rewrap_at_checkpoint = False

    def __init__(self) -> None:
        self.state: powerSGD_hook.PowerSGDState | None = None

    def comm_hook(self, cfg: Config, ledger: Ledger, group: dist.ProcessGroup) -> tuple[Any, Any]:
        if self.state is None:
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

            p = cfg.powersgd
            self.state = powerSGD_hook.PowerSGDState(
                process_group=group,
                matrix_approximation_rank=p.rank,
                start_powerSGD_iter=p.start_iter,
                use_error_feedback=p.error_feedback,
                warm_start=p.warm_start,
                random_seed=cfg.seed,
            )
        return self.state, _counted_powersgd_hook(ledger)

    def bucket_cap_mb(self, cfg: Config, backend: str) -> float:
        # PowerSGD issues its later all-reduces from future callbacks; with several buckets
        # ranks may issue them in different orders, which gloo can't match
        # ("Received data size doesn't match"). One bucket keeps a single order.
        return 1e6 if backend == "gloo" else cfg.dist.bucket_cap_mb


class AB(DDP):
    """AB training: groups train A or B independently between world-wide syncs. A group is
    `ab.group_size` ranks, by default one node."""

    low_rank = True
    all_train_b = False

    def default_group_size(self, ranks_per_node: int) -> int:
        return ranks_per_node

    def group_size(self, cfg: Config, world_size: int, ranks_per_node: int) -> int:
        size = cfg.ab.group_size or self.default_group_size(ranks_per_node)
        key = "ab.group_size" if cfg.ab.group_size else "ranks per node (default ab.group_size)"
        if world_size % size:
            raise ConfigError(f"{key}={size} does not divide the world size {world_size}")
        if world_size // size < 2:
            raise ConfigError(
                f"{key}={size} gives {world_size // size} group on {world_size} ranks; "
                "AB training needs at least one A group and one B group"
            )
        return size

    def smallest_world(self, cfg: Config, ranks_per_node: int | None) -> tuple[int, int]:
        """An A and a B group, of ab.group_size ranks or (group_size null) one node each."""
        if cfg.ab.group_size is None:
            return 2 * (ranks_per_node or 1), ranks_per_node or 1
        return 2 * cfg.ab.group_size, ranks_per_node or 2 * cfg.ab.group_size

    def group_roles(self, world_size: int, group_size: int) -> list[tuple[list[int], str]]:
        return groups.roles(world_size, group_size, all_train_b=self.all_train_b)


class ABIndividual(AB):
    """AB training in which every rank is a group of its own."""

    def default_group_size(self, ranks_per_node: int) -> int:
        return 1

    def smallest_world(self, cfg: Config, ranks_per_node: int | None) -> tuple[int, int]:
        return 2, ranks_per_node or 2


class ABNoGroups(AB):
    """The paper's "no groups": every rank trains B, in one group of the world or in groups
    of `ab.group_size` whose B is averaged at the sync."""

    all_train_b = True

    def group_size(self, cfg: Config, world_size: int, ranks_per_node: int) -> int:
        size = cfg.ab.group_size or world_size
        if world_size % size:
            raise ConfigError(f"ab.group_size={size} does not divide the world size {world_size}")
        if size < world_size and cfg.ab.sync_mode == "only_learned":
            raise ConfigError(
                "ab_nogroups with ab.group_size below the world averages B over the groups: "
                "it needs ab.sync_mode with_stale or rank0 (no A ranks to share A from)"
            )
        return size

    def smallest_world(self, cfg: Config, ranks_per_node: int | None) -> tuple[int, int]:
        size = cfg.ab.group_size or 1
        return size, ranks_per_node or size


class ABPowerSGD(AB):
    """AB training whose full-rank steps (warm-up and rebounds) send PowerSGD-compressed
    gradients over the world; AB phases stay inside their groups, uncompressed.

    One PowerSGD state lives through the run, so its first `start_iter` full-rank steps
    (in the warm-up) are uncompressed and every later one is compressed, and its
    warm-start factors (an initial guess for the power iteration, harmless when stale)
    carry from one rebound to the next. Its error feedback does not: the residual is
    gradient that was never applied to a W the sync has since replaced by the average of
    the groups' A·B, so it is dropped at each sync."""

    compresses = True
    rewrap_at_checkpoint = False  # PowerSGD's memory is keyed by bucket

    def __init__(self) -> None:
        self.powersgd = PowerSGD()

    def comm_hook(self, cfg: Config, ledger: Ledger, group: dist.ProcessGroup) -> tuple[Any, Any]:
        if group is not None:  # an AB phase: DDP inside the group
            return super().comm_hook(cfg, ledger, group)
        if self.powersgd.state is not None:  # a rebound: the first wrap after a sync
            self.powersgd.state.error_dict.clear()
        return self.powersgd.comm_hook(cfg, ledger, group)

    def bucket_cap_mb(self, cfg: Config, backend: str) -> float:
        return self.powersgd.bucket_cap_mb(cfg, backend)


class LocalSGD(DDP):
    """Post-local SGD (Lin et al. 2020): DDP over the world for `localsgd.warmup_steps`,
    then DDP inside each node, the nodes' parameters (and float buffers) averaged across
    nodes every `localsgd.period` steps. torch ships the same as `PeriodicModelAverager`
    behind `PostLocalSGDOptimizer`; abtrain averages in one counted all-reduce of its own
    instead (`sync.average_replicas`), as the averager's all-reduce would escape the ledger
    and its per-process-group period would duplicate the schedule. Each node keeps its
    optimizer's moments, as torch's wrapper does: only the parameters are averaged."""

    local = True

    def settings(self, cfg: Config) -> Any:
        """The config section of the method's warm-up and period."""
        return cfg.localsgd

    def group_size(self, cfg: Config, world_size: int, ranks_per_node: int) -> int:
        if world_size % ranks_per_node:
            raise ConfigError(
                f"{ranks_per_node} ranks per node do not divide the world size {world_size}"
            )
        return ranks_per_node

    def group_roles(self, world_size: int, group_size: int) -> list[tuple[list[int], str]]:
        return [
            (list(range(start, start + group_size)), "local")
            for start in range(0, world_size, group_size)
        ]


class DiLoCo(LocalSGD):
    """DiLoCo (Douillard et al. 2023): the run's optimizer as the inner one, DDP inside each
    node; every `diloco.period` steps the pseudo-gradient (the weights of the last outer
    step minus the node's) averaged across nodes and applied by an outer SGD step with
    Nesterov momentum (`abtrain.method.outer`). Each node keeps its inner moments."""

    def settings(self, cfg: Config) -> Any:
        return cfg.diloco


KINDS: dict[str, type[DDP]] = {
    "ddp": DDP,
    "powersgd": PowerSGD,
    "ab": AB,
    "ab_individual": ABIndividual,
    "ab_nogroups": ABNoGroups,
    "ab_powersgd": ABPowerSGD,
    "localsgd": LocalSGD,
    "diloco": DiLoCo,
}


def unread_sections(method: str) -> dict[str, str]:
    """The config sections of other methods' knobs that `method` never reads, each with why
    (printouts leave them out; the search stage need not track them)."""
    kind = KINDS[method]
    out = {}
    if not kind.low_rank and method != "localsgd":  # localsgd.schedule=ab follows ab.*
        out["ab"] = "has no AB phases"
    if not kind.compresses:
        out["powersgd"] = "sends no PowerSGD factors"
    for name in ("localsgd", "diloco"):
        if name != method:
            out[name] = f"is not {name}"
    return out


def make(name: str) -> DDP:
    return KINDS[name]()


def kind(name: str) -> type[DDP]:
    """The method's class, for its class-level answers (`low_rank`, `compresses`)."""
    return KINDS[name]


def check_world(cfg: Config, world_size: int, ranks_per_node: int) -> int:
    """Check the method's groups can be formed on this world; returns the group size."""
    return make(cfg.method).group_size(cfg, world_size, ranks_per_node)
