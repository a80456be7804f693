"""AB training as one object that any training loop uses: `ABTraining(model, optimizer,
steps=N)`, the paper's guideline schedule for a run of N steps (`abtrain.method.guidelines`), or
`ABTraining(model, optimizer, cfg)` with a config object or file.

Algorithm 1 of the paper, seen from the loop. Before each step's forward pass,
`module(step)` moves the model into that step's phase and returns the module to run:

- warm-up: full-rank DDP over the world (lines 1-8);
- AB phase: every W factorised as A·B by SVD, this rank's group training A or B with DDP
  inside the group, nothing crossing groups (lines 10-17);
- sync: A and B averaged over the world, W = A·B rebuilt (lines 18-21);
- rebound: full-rank DDP over the world, then the next AB phase.

Each change of representation restarts the learning rate from a fraction of it: multiply
the loop's own learning rate by `lr_factor(step)`, set `lr(step, base)`, or wrap a torch
scheduler in `rebound(scheduler)`. During an AB phase the replicas differ (each group trains
its own factor): an evaluation there scores this rank's replica. `finish()` ends merged and full rank;
`full_rank_model()` gives the model back with its own Linear/Conv2d layers. Every
collective is counted in `ledger` (bytes within and across nodes, by phase). DDP, PowerSGD
and the AB variants are this same object, the first two with one full-rank phase; so are
local SGD and DiLoCo (`method="localsgd"`, `"diloco"`), whose local phases train the full
model inside each node and end in an average across nodes (DiLoCo's an outer Nesterov step,
`abtrain.method.outer`), with no factorisation (and, but under `localsgd.schedule: ab`, no
rebound). abtrain's `Trainer` is a loop over it.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from abtrain.config import ConfigError, MethodConfig
from abtrain.distributed import batchnorm, groups, ledger, process
from abtrain.method import guidelines, lowrank, methods, outer, schedule, sync
from abtrain.method.rebound import ReboundLR
from abtrain.method.schedule import Phase

DONE = Phase("done")  # after `finish()`: merged, full rank, no DDP wrapper
# DistributedDataParallel's arguments each phase sets; `ddp_options` may give the others
DDP_SET_HERE = {
    "module",
    "device_ids",
    "process_group",
    "init_sync",
    "forward_sync_buffers",
    "gradient_as_bucket_view",
    "bucket_cap_mb",
    "device_mesh",
}


class ABTraining:
    """AB training (or any method of `cfg.method`) of `model` with `optimizer`.

    Needs a process group (`torch.distributed.init_process_group`, e.g. under torchrun).
    The settings: `steps=N` alone gives the paper's guidelines for a run of N steps, any of
    them overridden by keyword (`sigma_cutoff=0.3`, `warmup_steps=100`, `group_size=1`,
    `method="ab_nogroups"`, `seed`: every key of the `ab` section); or `cfg`, an
    `abtrain.MethodConfig` (`abtrain.method_config(...)`, which also takes PowerSGD's and
    DDP's settings), a whole `Config`, or a YAML file's path, keywords replacing its values.
    On construction the model's factorisable layers become `lowrank.LowRankLayer`s in
    place (same weight and bias parameters) and their factors A, B join the optimizer in
    the param group of their layer's weight; `survey` says, for every weight layer, whether
    it is factorised or kept full rank and why. Every rank must build the same model, as
    under DDP.

    `node` is this rank's node (default: torchrun's GROUP_RANK or SLURM_NODEID); `run_dir`,
    if given, receives the ledger's `ledger.csv` (and per-collective rows with
    `ledger_rows`). `ddp_options` go to every DistributedDataParallel it wraps, e.g.
    `{"find_unused_parameters": True}` for a model with a layer some steps leave unused.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        cfg: MethodConfig | str | Path | None = None,
        *,
        steps: int | None = None,
        method: str | None = None,
        seed: int | None = None,
        device: torch.device | None = None,
        node: int | None = None,
        run_dir: str | Path | None = None,
        ledger_rows: bool = False,
        ddp_options: dict[str, Any] | None = None,
        **ab_settings: Any,
    ) -> None:
        taken = sorted(set(ddp_options or {}) & DDP_SET_HERE)
        if taken:
            raise ConfigError(
                f"ddp_options: {', '.join(taken)} is set by ABTraining itself (each phase's "
                f"group and buckets); pass DDP's other arguments, e.g. find_unused_parameters"
            )
        self.ddp_options = dict(ddp_options or {})
        given = dict(steps=steps, method=method, seed=seed, **ab_settings)
        cfg = guidelines.settle(cfg, given)
        self.model, self.optimizer, self.cfg = model, optimizer, cfg
        self.method = methods.make(cfg.method)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.backend = dist.get_backend()
        self.device = device or _default_device(self.backend)
        nodes = process.node_map(groups.node_id_from_env() if node is None else node, self.device)
        self.ledger = ledger.Ledger(
            self.rank, nodes, Path(run_dir) if run_dir else None, ledger_rows, self.device
        )
        self.ledger.record("all_gather", 8, None)  # the node map itself
        self.nodes = len(set(nodes))
        group_size = self.method.group_size(cfg, self.world, nodes.count(nodes[self.rank]))
        pgs = groups.ProcessGroups()
        self.fanout = groups.fanout(self.rank, nodes, 0, pgs)  # rank 0's state to every rank
        if cfg.dist.sync_batchnorm != "local":
            batchnorm.convert(model)
        self.layers: dict[str, lowrank.LowRankLayer] = {}
        self.groups: groups.ABGroups | None = None
        self._originals: dict[str, nn.Module] = {}  # the layers the LowRankLayers replace
        # every weight layer: factorised, or kept full rank and why (layers.csv, summary)
        self.survey: list[lowrank.LayerChoice] | None = None
        if self.method.low_rank:
            modules = dict(model.named_modules())
            trained = {id(p) for g in optimizer.param_groups for p in g["params"]}
            self.survey = lowrank.survey(model, cfg.ab.full_rank_layers, trained)
            self.layers = lowrank.replace(model, self.survey)
            self._originals = {name: modules[name] for name in self.layers}
            if not self.layers:
                raise ConfigError(
                    f"method {cfg.method}: the model has no layer AB training can factorise; "
                    f"every weight layer is kept full rank: {lowrank.why_kept(self.survey)}"
                )
            model.to(self.device)
        if self.method.low_rank or self.method.local:
            roles = self.method.group_roles(self.world, group_size)
            learners = self.method.low_rank and cfg.ab.sync_mode == "only_learned"
            self.groups = groups.build(self.rank, roles, learners, nodes, pgs)
        if self.method.low_rank:
            _add_factors(optimizer, self.layers)
        self.outer: outer.OuterStep | None = None  # DiLoCo's outer weights and momentum
        if cfg.method == "diloco":
            self.outer = outer.OuterStep(model, cfg.diloco.outer_lr, cfg.diloco.outer_momentum)
        self.phase: Phase | None = None  # the representation the model is in now
        self.step: int | None = None  # the last step `module` was asked for
        self.factorizations: list[dict[str, Any]] = []  # step, compression_ratio, ranks
        self.split = False  # a grouped phase has begun: each group keeps its own state
        self.ddp: DistributedDataParallel | None = None
        self.fresh = True  # no wrap yet: the first one gives every rank rank 0's state
        self.loaded = False  # a state loaded: the first step may be any
        # seconds spent since the last `take_times()` in syncs (comm), SVDs, DDP wraps
        self.spent = dict.fromkeys(("comm", "svd", "wrap"), 0.0)

    # ---------------------------------------------------------------- the loop's calls
    def module(self, step: int) -> nn.Module:
        """The module to run step `step` with (DDP over this phase's group), after moving
        the model into the phase the schedule gives that step. Steps come in order: the
        step after the last one asked for, or the same one again (micro-batches of one
        step); any other is refused (ValueError) before anything changes, since a jump
        would skip a phase change and a step back would redo one."""
        self._check_order(step)
        self.step = self.ledger.step = step
        self._enter(schedule.phase_at(step, self.cfg))
        return self.ddp

    def _check_order(self, step: int) -> None:
        if self.phase == DONE:
            raise ValueError(f"module({step}) after finish(): the run has ended merged")
        if not 0 <= step < self.cfg.steps:
            raise ValueError(f"module({step}): steps run from 0 to {self.cfg.steps - 1}")
        if self.step is None and step != 0 and not self.loaded:
            raise ValueError(
                f"module({step}) as the first call: a run starts at step 0 (a later start "
                "would skip the warm-up); to continue a run, load_state_dict() its state first"
            )
        if self.step is not None and step not in (self.step, self.step + 1):
            raise ValueError(
                f"module({step}) after module({self.step}): steps must come in order, "
                f"the next is {self.step + 1} (or {self.step} again); a jump would skip a "
                "phase change and a step back redo one"
            )

    def lr_factor(self, step: int, base: Callable[[int], float] | None = None) -> float:
        """The learning-rate rebound at `step`, a factor of the loop's own LR: the ramp
        (i+1)/(N+1) over the N = `ab.lr_rebound_steps` steps i = 0.. after each change of
        representation (1/(N+1) at the change: 0.5 with N = 1), else 1. Under
        `ab.lr_rebound: authors` the ramp is set from the schedule's value at the change,
        so give your schedule, `base` (the LR as a function of the step). Multiply an LR
        computed from the step alone by it; with a torch scheduler use `rebound()`."""
        if self.cfg.ab.lr_rebound == "abtrain":
            return schedule.rebound_factor(step, self.cfg)
        if base is None:
            raise ConfigError(
                "ab.lr_rebound=authors sets the LR from the schedule's own value at each "
                "change: call lr_factor(step, base=your_schedule), a function of the step"
            )
        lr = base(step)
        return schedule.rebound_lr(step, self.cfg, base) / lr if lr else 1.0

    def lr(self, step: int, base: Callable[[int], float]) -> float:
        """The learning rate at `step` of a loop whose own schedule is `base` (the LR as a
        function of the step), with the rebound after each change applied: right under
        either `ab.lr_rebound`. What abtrain's trainer sets each step."""
        return schedule.rebound_lr(step, self.cfg, base)

    def rebound(self, scheduler: Any) -> ReboundLR:
        """Any torch LR scheduler with the rebound applied on top (`rebound.ReboundLR`):
        call the returned object's `step()` in place of the scheduler's. Right for a
        chainable scheduler too (CosineAnnealingLR), where `lr_factor` would compound."""
        return ReboundLR(scheduler, self.cfg)

    def finish(self) -> nn.Module:
        """End the run merged and full rank (a sync if it stands in an AB phase); returns
        the model, whose factorised layers now compute with W = A·B."""
        self.ledger.step = max(self.ledger.step, self.cfg.steps)
        if self.phase != DONE:
            self._enter(DONE)
        return self.model

    def full_rank_model(self) -> nn.Module:
        """The model with its own layers back in place of the LowRankLayers (holding the
        merged weights); call after `finish()`. This object is of no further use then."""
        if self.phase is None:
            raise RuntimeError(
                "full_rank_model() before the first module(): nothing has trained, and the "
                "object would lose the layers it factorises; call it after finish()"
            )
        if self.phase != DONE:
            raise RuntimeError("full_rank_model() before finish(): the replicas still differ")
        for name, layer in self._originals.items():  # they share W and bias with the wrappers
            parent, _, child = name.rpartition(".")
            setattr(self.model.get_submodule(parent) if parent else self.model, child, layer)
        self.layers, self._originals = {}, {}
        return self.model

    @property
    def role(self) -> str | None:
        """The factor this rank trains in AB phases ('a' or 'b'; None without them)."""
        return self.groups.role if self.groups and self.method.low_rank else None

    def replica_group(self) -> dist.ProcessGroup | None:
        """The ranks holding one replica of the model and its optimizer state: the world
        until the first AB or local phase, then this rank's group (its factors' moments, a
        node's inner moments, are its own). Their first rank alone need save that state."""
        return self.groups.group if self.split else None

    def traffic(self, exact: bool = False) -> dict[str, Any]:
        """Bytes each rank sent so far (mean over ranks): total, inter-node, intra-node,
        and by phase. Any rank may ask alone: the mean as this rank's ledger sees every
        collective it took part in, exact wherever the groups mirror one another (as the
        A/B groups of one node each do). `exact=True` sums the ranks' own counts instead:
        a collective, every rank must call it together."""
        if not exact:
            return self.ledger.view()
        self.ledger.flush()
        return self.ledger.totals(self.world)

    def state_dict(self, outer: bool = True) -> dict[str, Any]:
        """What a checkpoint needs besides the model's and the optimizer's state dicts: the
        phase, the factorisations, the factors' shapes, the ledger's totals and DiLoCo's
        outer weights and momentum (the same on every rank: `outer=False` leaves them to a
        checkpoint that keeps one copy, `self.outer.state_dict()`). Every rank together
        (the ledger is summed over the ranks first).

        Taking it also makes the next step wrap DDP anew, as a run resumed from it will:
        the same gradient buckets, so the resumed run is bit for bit the uninterrupted
        one. (PowerSGD keeps its wrapper: its error memory is keyed by bucket.)"""
        self.ledger.flush()
        if self.method.rewrap_at_checkpoint:
            self.ddp = None
        return dict(
            phase=asdict(self.phase) if self.phase else None,
            step=self.step,
            factorizations=self.factorizations,
            shapes={n: [list(m.a.shape), list(m.b.shape)] for n, m in self.layers.items()},
            ledger=self.ledger.state(),
            split=self.split,
            outer=self.outer.state_dict() if self.outer and outer else None,
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: give the factors their saved shapes and roles; then load the model's and
        the optimizer's state dicts as usual."""
        self.phase = Phase(**state["phase"]) if state["phase"] else None
        self.step = state.get("step")  # None in checkpoints from before it was kept
        self.factorizations = state["factorizations"]
        self.split = state.get("split", bool(self.factorizations))  # older: AB's only
        if self.outer is not None and state.get("outer") is not None:
            self.outer.load_state_dict(state["outer"])
        for name, layer in self.layers.items():
            a, b = state["shapes"][name]
            layer.a.data = torch.empty(a, dtype=layer.a.dtype, device=layer.a.device)
            layer.b.data = torch.empty(b, dtype=layer.b.dtype, device=layer.b.device)
            if self.phase is not None and self.phase.low_rank:
                layer.set_factors(layer.a.data, layer.b.data, self.role)
        self.ledger.load_state(state["ledger"])
        self.ddp, self.fresh, self.loaded = None, False, True

    def take_times(self) -> dict[str, float]:
        """Seconds spent in syncs (comm), SVDs and DDP wraps since the last call."""
        spent, self.spent = self.spent, dict.fromkeys(self.spent, 0.0)
        return spent

    # ---------------------------------------------------------------- phase changes
    def _enter(self, phase: Phase) -> None:
        """Move the model into `phase`'s representation; re-wrap DDP where needed."""
        if phase == self.phase:
            if self.ddp is None:
                self._wrap(init_sync=False)
            return
        prev, self.phase = self.phase, phase
        if prev is not None and prev.grouped:  # Algorithm 1, lines 18-21; local SGD's average
            t0 = process.clock(self.device)
            with self.ledger.during("sync"):
                if prev.low_rank:
                    self._sync()
                else:
                    self._average_nodes()
            self.spent["comm"] += process.clock(self.device) - t0
        if self.outer is not None and phase.grouped and not self.split:
            self.outer.begin()  # the warm-up's end: its weights are the first outer ones
        self.split |= phase.grouped
        if phase.low_rank:  # lines 10-14
            t0 = process.clock(self.device)
            with self.ledger.during("factorize"):
                self._factorize()
            self.spent["svd"] += process.clock(self.device) - t0
        if prev is not None:
            lowrank.adapt_optimizer_state(self.optimizer, self.layers, self.cfg.ab.optimizer_state)
        self.ledger.phase = phase.kind
        if phase.kind == "local" and prev is not None and prev.kind == "local" and self.ddp:
            return  # one local phase after another: the same group, the same DDP wrapper
        if phase != DONE:
            self._wrap(init_sync=self.fresh)

    def _sync(self) -> None:
        """A and B averaged as `ab.sync_mode` says (with the other parameters and the
        moments every group trained, over the world); then W = A·B. (`rank0`: W = A·B,
        then rank 0's state to every rank.)"""
        moments = [
            state[key]
            for p in sync.shared_params(self.model, self.layers)
            if (state := self.optimizer.state.get(p))
            for key in ("exp_avg", "exp_avg_sq")
        ]
        if self.cfg.ab.sync_mode == "rank0":  # the authors' no-groups runs at c3dbc10
            sync.take_rank0(self.model, self.layers, self.ledger, self.fanout)
            return
        sync.average(
            self.model, self.layers, self.groups, self.cfg.ab.sync_mode, self.ledger, moments
        )
        sync.merge(self.layers)

    def _average_nodes(self) -> None:
        """The end of a local phase: the nodes' parameters averaged (local SGD), or
        DiLoCo's outer step on their averaged pseudo-gradient."""
        if self.outer is not None:
            self.outer.step(self.ledger)
        else:
            sync.average_replicas(self.model, self.ledger)

    def _factorize(self) -> None:
        ab = self.cfg.ab
        before = {name: (layer.a, layer.b) for name, layer in self.layers.items()}
        ranks = sync.factorize_layers(
            self.layers, ab.sigma_cutoff, self.groups.role, self.ledger, ab.split_sigma
        )
        lowrank.renew_factors(self.optimizer, before, self.layers)
        ratio = lowrank.compression_ratio(self.model)
        self.factorizations.append(
            dict(step=self.ledger.step, compression_ratio=ratio, ranks=ranks)
        )

    def _wrap(self, init_sync: bool) -> None:
        """DDP over this phase's group: the world, or this rank's A/B group or node."""
        t0, self.ddp = process.clock(self.device), None
        # the old wrapper's reducer must drop its autograd hooks first: it is in a reference
        # cycle, so only a full collection frees it (a loop that calls gc.freeze() once
        # built keeps that short: abtrain.run.trainer does)
        gc.collect()
        group = self.groups.group if self.phase.grouped else None
        if init_sync and group is None:
            sync.share_model(self.model, self.ledger, self.fanout)  # two hops, not DDP's one
            init_sync = False
        elif init_sync:  # a run that starts in an AB phase: DDP's broadcast, in the group
            state = [p for p in self.model.parameters()] + list(self.model.buffers())
            size = sum(t.numel() * t.element_size() for t in state)
            self.ledger.record("broadcast", size, group, root=ledger.group_ranks(group)[0])
        batchnorm.attach(self.model, group, self.ledger, self.cfg.dist.sync_batchnorm)
        self.ddp = DistributedDataParallel(
            self.model,
            device_ids=[self.device.index] if self.device.type == "cuda" else None,
            process_group=group,
            init_sync=init_sync,
            forward_sync_buffers=False,
            gradient_as_bucket_view=True,  # one copy of the gradients, not two
            bucket_cap_mb=self.method.bucket_cap_mb(self.cfg, self.backend),
            **self.ddp_options,
        )
        self.ddp.register_comm_hook(*self.method.comm_hook(self.cfg, self.ledger, group))
        self.fresh = False
        self.spent["wrap"] += process.clock(self.device) - t0


def _default_device(backend: str) -> torch.device:
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _add_factors(opt: torch.optim.Optimizer, layers: dict[str, lowrank.LowRankLayer]) -> None:
    """Each layer's A and B into the param group of its weight (its learning rate, weight
    decay and betas), unless the optimizer has them already."""
    group_of = {id(p): g for g in opt.param_groups for p in g["params"]}
    for layer in layers.values():  # each weight in the optimizer: the survey saw to it
        group = group_of[id(layer.w)]
        for factor in (layer.a, layer.b):
            if id(factor) not in group_of:
                group["params"].append(factor)
                group_of[id(factor)] = group
