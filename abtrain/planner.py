"""Traffic and storage without training: the ledger's rules applied analytically.

From a config (model, schedule, method), a node count and ranks per node, predict the
inter-node bytes each rank sends, in total and per step, for the ring/chain wire model of
`abtrain.ledger`; and what the run keeps (`footprint`): model and optimizer memory per
GPU, checkpoint bytes and disk, ledger and log records. The ranks of the factorised layers
are what training decides; the planner takes them as an assumption: a fraction of each
layer's full rank (`keep`). And how long a run takes over a given link (`timing`): each
step's compute (measured or stated) plus its node's bytes over the link; from it the rate,
GB/s per process over wall time, the quantity of the paper's Table 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from abtrain import lowrank, methods, models, schedule
from abtrain.config import Config
from abtrain.ledger import STEP_TABLE_BYTES

# What torch.save adds per tensor (zip entry, 64-byte alignment, pickled key and rebuild
# call: 240-320 B measured for short keys), and per file.
TENSOR_OVERHEAD = 300
FILE_OVERHEAD = 1_300
# Each rank's small state, as measured inside a checkpoint file: torch's CPU generator
# (5,056 B) and python's `random` state (9.1 KB together), the CUDA generator's 16 B, the
# ledger's totals (1.5 KB) and the loop's time accounts (~0.6 KB).
RNG_BYTES = 9_200
LEDGER_TOTALS_BYTES = 1_500
TIMES_BYTES = 600
# Rows as the redesigned ledger writes them.
AGGREGATE_ROW_BYTES = 60  # ledger.csv: one row per (step, phase, op)
TRAIN_LOG_ROW_BYTES = 50  # train_log.csv: one row per step
COLLECTIVE_ROW_BYTES = 250  # optional per-collective JSON rows: one per collective per rank
# The run record every rank's file carries: evaluations, factorisations (their ranks).
EVAL_RECORD_BYTES = 100
RANK_RECORD_BYTES = 24  # a layer's rank in one factorisation
SHAPE_RECORD_BYTES = 64  # a factorised layer's name and the shapes of its A and B
FACTORIZATION_BYTES = 40
# A rank's ledger in memory: one table of STEP_TABLE_BYTES per step since the last flush
# (each checkpoint), with the tensor's and its dict entry's own overhead.
PENDING_STEP_OVERHEAD = 300
# Per-collective rows (if switched on) wait in memory until the flush as dicts (~1 KB).
ROW_MEMORY = 1_000


@dataclass(frozen=True)
class Sizes:
    """Bytes (fp32) of a model's parts; the factors at the assumed `keep`."""

    params: int  # parameter count, full rank
    full: int  # every parameter
    shared: int  # parameters never factorised (biases, norms, tokens, full-rank layers)
    a: int  # the factors A of every factorised layer at `keep`
    b: int  # the factors B
    layers: int  # factorised layers
    buffers: int  # every buffer (BatchNorm's running stats and counters)
    buffer_tensors: int
    float_buffers: int  # how many are floating point (the sync averages them)
    float_buffer_bytes: int
    tensors_full: int  # parameter tensors of the full-rank model
    tensors_shared: int  # of them, the ones never factorised
    batchnorm_layers: int  # BatchNorm2d layers, each synced per step (dist.sync_batchnorm)
    batchnorm_stats: int  # bytes of every layer's (Σx, Σx², n): 2C+1 floats
    batchnorm_grads: int  # bytes of the gradients of (Σx, Σx²) torch all-reduces: 2C floats

    @property
    def weights(self) -> int:
        """The factorised layers' W."""
        return self.full - self.shared

    def trained(self, role: str) -> int:
        """Bytes a rank of role 'a' or 'b' trains in an AB phase: its factor + shared."""
        return (self.a if role == "a" else self.b) + self.shared


_SIZES: dict[tuple, Sizes] = {}


def sizes(cfg: Config, classes: int, keep: float = 1.0) -> Sizes:
    """The model's sizes, built on the meta device (no memory, no init cost)."""
    features = getattr(cfg.data, "features", 0)
    layers_key = tuple(cfg.ab.full_rank_layers) if cfg.ab.full_rank_layers is not None else None
    key = (cfg.model.model_dump_json(), classes, features, layers_key, keep)
    if key in _SIZES:
        return _SIZES[key]
    with torch.device("meta"):
        model = models.build(cfg, classes, features)
    params = list(model.parameters())
    full = 4 * sum(p.numel() for p in params)
    norms = [m.num_features for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    layers = lowrank.convert(model, cfg.ab.full_rank_layers)
    weights = {id(layer.weight) for layer in layers.values()}
    a = b = 0
    for layer in layers.values():
        rows, cols = layer.weight.shape[0], layer.weight[0].numel()
        k = max(1, round(keep * min(rows, cols)))
        (long, _), (_, short) = lowrank.factor_shapes(layer.weight.shape, k)
        a, b = a + 4 * long * k, b + 4 * k * short
    out = Sizes(
        params=sum(p.numel() for p in params),
        full=full,
        shared=full - 4 * sum(layer.weight.numel() for layer in layers.values()),
        a=a,
        b=b,
        layers=len(layers),
        buffers=sum(t.numel() * t.element_size() for t in model.buffers()),
        buffer_tensors=len(list(model.buffers())),
        float_buffers=sum(t.is_floating_point() for t in model.buffers()),
        float_buffer_bytes=sum(
            t.numel() * t.element_size() for t in model.buffers() if t.is_floating_point()
        ),
        tensors_full=len(params),
        tensors_shared=sum(id(p) not in weights for p in params),
        batchnorm_layers=len(norms),
        batchnorm_stats=sum(4 * (2 * c + 1) for c in norms),
        batchnorm_grads=sum(4 * 2 * c for c in norms),
    )
    _SIZES[key] = out
    return out


def ring_inter(size: float, nodes: int, ranks: int) -> float:
    """Mean inter-node bytes per rank of a ring all-reduce of `size` bytes over contiguous
    ranks on `nodes` nodes: every rank sends 2(n-1)/n·S, and `nodes` ring edges cross."""
    if nodes < 2:
        return 0.0
    return 2 * (ranks - 1) / ranks * size * nodes / ranks


def gather_inter(size: float, nodes: int, ranks: int) -> float:
    """Mean inter-node bytes per rank of a ring all-gather of `size` bytes from each rank:
    every rank sends (n-1)·S, and `nodes` ring edges cross."""
    return (ranks - 1) * size * nodes / ranks if nodes > 1 else 0.0


def chain_inter(size: float, nodes: int, ranks: int) -> float:
    """Mean inter-node bytes per rank of a broadcast along the chain from rank 0."""
    return size * (nodes - 1) / ranks if nodes > 1 else 0.0


def count_evaluations(cfg: Config) -> int:
    """As the trainer does them: due every eval_every steps, put off to the end of an AB
    phase (several due in one phase make one), and one at the very end."""
    count, pending = 1, False
    for t in range(cfg.steps):
        if pending and not schedule.phase_at(t, cfg).low_rank:
            count, pending = count + 1, False
        pending |= (t + 1) % cfg.eval_every == 0
    return count


def checkpoint_steps(cfg: Config) -> list[int]:
    """Step counts at which the trainer checkpoints: every checkpoint_every, and the end."""
    every = cfg.checkpoint_every
    return [*(range(every, cfg.steps, every) if every else ()), cfg.steps]


@dataclass
class Plan:
    """Inter-node bytes each rank sends (the mean over ranks), split by where they go.

    `step_bytes[kind]`: one training step of that phase kind ('full' for methods without
    phases; 'warmup', 'ab', 'rebound' for AB); `steps[kind]`: how many such steps;
    `event_bytes`: what is sent outside training steps: 'sync' (factor averaging and
    agreeing on ranks), 'setup', 'eval', 'checkpoint' (flags and the ledger's tables);
    `syncs`: how many syncs."""

    steps: dict[str, int]
    step_bytes: dict[str, float]
    event_bytes: dict[str, float]
    syncs: int = 0

    @property
    def total_steps(self) -> int:
        return sum(self.steps.values())

    @property
    def inter_bytes(self) -> float:
        """Per rank over the run."""
        return sum(self.steps[k] * self.step_bytes[k] for k in self.steps) + sum(
            self.event_bytes.values()
        )

    @property
    def per_step(self) -> float:
        return self.inter_bytes / self.total_steps


def _powersgd_bytes(cfg: Config, classes: int) -> int:
    """Bytes of the P and Q factors torch's PowerSGD hook all-reduces for the whole model
    (a tensor whose factors would not be smaller is sent whole)."""
    with torch.device("meta"):
        model = models.build(cfg, classes, getattr(cfg.data, "features", 0))
    r, compressed = cfg.powersgd.rank, 0
    for p in model.parameters():
        rows, cols = p.shape[0], p.numel() // p.shape[0]
        k = min(rows, cols, r)
        compressed += (rows + cols) * k if (rows + cols) * k * 2 < rows * cols else rows * cols
    return 4 * compressed


def plan(cfg: Config, nodes: int, ranks_per_node: int, classes: int, keep: float = 1.0) -> Plan:
    n = nodes * ranks_per_node
    s = sizes(cfg, classes, keep)
    full = s.full

    def ring(size: float) -> float:
        return ring_inter(size, nodes, n)

    events = dict(
        # the node map (all-gather, ring), the tracking flag, the first wrap's broadcast of
        # rank 0's parameters and buffers
        setup=((n - 1) * 8 * nodes / n if nodes > 1 else 0.0)
        + chain_inter(8, nodes, n)
        + chain_inter(full + s.buffers, nodes, n),
        eval=count_evaluations(cfg) * ring(32),
        # a flag per checkpoint, and the ledger's per-step tables summed over the world at
        # each one: steps 0 to the end (the collectives after the last step are keyed to
        # step `steps`)
        checkpoint=len(checkpoint_steps(cfg)) * ring(8) + ring((cfg.steps + 1) * STEP_TABLE_BYTES),
        sync=0.0,
    )
    # synced batch norm, every training step: `group`, two all-reduces over the phase's DDP
    # group (the world in full-rank steps); `world`, torch's all-gather and all-reduce over
    # the world in every step, AB steps included
    norm = ab_norm = 0.0
    if cfg.dist.sync_batchnorm == "group":
        norm = ring(s.batchnorm_stats * 2)
    elif cfg.dist.sync_batchnorm == "world":
        norm = ab_norm = gather_inter(s.batchnorm_stats, nodes, n) + ring(s.batchnorm_grads)
    method = methods.kind(cfg.method)
    if not method.low_rank and not method.compresses:
        return Plan({"full": cfg.steps}, {"full": ring(full) + norm}, events)
    if not method.low_rank:  # PowerSGD
        start = min(cfg.powersgd.start_iter, cfg.steps)
        return Plan(
            {"uncompressed": start, "full": cfg.steps - start},
            {"uncompressed": ring(full) + norm, "full": ring(_powersgd_bytes(cfg, classes)) + norm},
            events,
        )
    kinds = [schedule.phase_at(t, cfg) for t in range(cfg.steps)]
    steps = {k: sum(p.kind == k for p in kinds) for k in ("warmup", "ab", "rebound")}
    cycles = len({p.cycle for p in kinds if p.kind == "ab"})
    # the sync averages the float buffers (BatchNorm's running statistics) over the world
    groups_ = ab_groups(cfg, n, ranks_per_node)
    if len(groups_) == 1:  # "no groups": B trained by DDP
        ab, sync = ring(s.b + s.shared) + norm, ring(s.float_buffer_bytes)
    elif cfg.ab.sync_mode == "rank0":  # B trained by DDP in each group; rank 0's W to all
        members = groups_[0][0]
        spanned = len({r // ranks_per_node for r in members})
        in_group = ring_inter(s.b + s.shared, spanned, len(members))
        if cfg.dist.sync_batchnorm == "group":
            in_group += ring_inter(s.batchnorm_stats * 2, spanned, len(members))
        ab, sync = in_group + ab_norm, chain_inter(full + s.buffers, nodes, n)
    elif cfg.ab.sync_mode == "with_stale":  # every factor averaged over the world
        ab, sync = ab_norm, ring(s.a + s.b + 3 * s.shared + s.float_buffer_bytes)
    else:  # groups are nodes (or single ranks): nothing crosses inside an AB phase
        ab, sync = ab_norm, _learned_sync(cfg, s, nodes, ranks_per_node)
    events["sync"] = cycles * (ring(8 * s.layers) + sync)  # agreeing on k; the averaging
    full_rank = ring(full) + norm
    step = {"warmup": full_rank, "ab": ab, "rebound": full_rank}
    if method.compresses:
        # one PowerSGD state for the run: its first start_iter full-rank steps (the
        # warm-up's, then the rebounds') are uncompressed
        start = min(cfg.powersgd.start_iter, steps["warmup"] + steps["rebound"])
        in_warmup = min(start, steps["warmup"])
        steps = dict(
            uncompressed=start,
            warmup=steps["warmup"] - in_warmup,
            ab=steps["ab"],
            rebound=steps["rebound"] - (start - in_warmup),
        )
        compressed = ring(_powersgd_bytes(cfg, classes)) + norm
        step = dict(uncompressed=full_rank, warmup=compressed, ab=ab, rebound=compressed)
    return Plan(steps, step, events, syncs=cycles)


def buffer_broadcast(cfg: Config, nodes: int, ranks_per_node: int, classes: int) -> dict:
    """What DDP's `broadcast_buffers` (torch's default, on in the authors' runs) would send
    and abtrain does not: before every forward pass, the first rank of the step's DDP group
    sends every buffer (BatchNorm's running statistics and counters) to the group. Returns
    the bytes of one broadcast and the mean inter-node bytes per rank per step of the run.
    abtrain leaves it off: its full-rank replicas agree without it, synced or local batch
    norm alike (the running statistics are averaged at each sync)."""
    s, n = sizes(cfg, classes), nodes * ranks_per_node
    p = plan(cfg, nodes, ranks_per_node, classes)
    per_step = {k: chain_inter(s.buffers, nodes, n) for k in p.steps}
    groups_ = ab_groups(cfg, n, ranks_per_node)
    if "ab" in p.steps and groups_:
        members = groups_[0][0]
        spanned = len({r // ranks_per_node for r in members})
        per_step["ab"] = chain_inter(s.buffers, spanned, len(members))
    total = sum(p.steps[k] * per_step[k] for k in p.steps)
    return dict(bytes=s.buffers, inter_bytes_per_step=total / p.total_steps)


def _learned_sync(cfg: Config, s: Sizes, nodes: int, ranks_per_node: int) -> float:
    """Mean inter-node bytes per rank of an `only_learned` sync: each factor averaged over
    the ranks that trained it, then broadcast to every rank from the first of them; the
    shared parameters, their two moments and the float buffers averaged over the world."""
    n = nodes * ranks_per_node
    out = ring_inter(3 * s.shared + s.float_buffer_bytes, nodes, n)
    for role, size in (("a", s.a), ("b", s.b)):
        ranks = [r for group, rl in ab_groups(cfg, n, ranks_per_node) if rl == role for r in group]
        spanned = len({r // ranks_per_node for r in ranks})
        out += len(ranks) * ring_inter(size, spanned, len(ranks)) / n
        out += chain_inter(size, nodes, n)
    return out


# ---------------------------------------------------------------- time and rate
@dataclass
class Timing:
    """A run's predicted time: per-step seconds by phase kind, the syncs, and the rate."""

    plan: Plan
    step_seconds: dict[str, float]
    sync_seconds: float  # one sync, its bytes and its local work
    seconds: float  # the whole run: steps and syncs (not start-up, evaluation, saving)

    @property
    def mean_step_seconds(self) -> float:
        return self.seconds / self.plan.total_steps

    @property
    def gb_per_s(self) -> float:
        """Inter-node GB/s per process over the run, the paper's Table 1 quantity."""
        return self.plan.inter_bytes / self.seconds / 1e9


def timing(
    p: Plan,
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


# ---------------------------------------------------------------- what the run keeps
@dataclass
class Footprint:
    """What a run keeps in memory and on disk; bytes unless named otherwise."""

    memory: dict[str, dict[str, int]]  # per GPU, by phase: params, grads, ... total
    checkpoint: dict[str, Any]
    ledger: dict[str, Any]


def ab_groups(cfg: Config, world: int, ranks_per_node: int) -> list[tuple[list[int], str]]:
    """The A/B groups the trainer forms ([] for methods without AB phases)."""
    method = methods.make(cfg.method)
    return method.group_plan(world, method.group_size(cfg, world, ranks_per_node))


def _file(params: int, param_tensors: int, trained: int, trained_tensors: int) -> int:
    """A torch.save'd model state and AdamW state (exp_avg, exp_avg_sq and a 0-d step
    for each parameter it trained)."""
    moments = 2 * trained + 4 * trained_tensors
    overhead = TENSOR_OVERHEAD * (param_tensors + 3 * trained_tensors) + FILE_OVERHEAD
    return params + moments + overhead


def replica_bytes(s: Sizes) -> int:
    """The full-rank model's replica: parameters and two moments, three times its bytes."""
    return _file(s.full, s.tensors_full, s.full, s.tensors_full)


def saved_replica_bytes(s: Sizes, phase: str, role: str, carry: bool) -> int:
    """One replica's file as the trainer writes it: the model's whole state_dict and the
    writer's whole AdamW state. A factorised layer keeps W (frozen) in AB phases and A,
    B (for their shapes) after; with ab.optimizer_state=carry the moments of W, and of the
    factor the writer (of role `role`) trained, stay in AdamW's state. `phase`: 'full'
    (before any factorisation), 'ab', or 'rebound' (full rank after one)."""
    if phase == "full":
        return replica_bytes(s)
    params, tensors = s.full + s.a + s.b, s.tensors_full + 2 * s.layers
    factor = s.a if role == "a" else s.b
    if phase == "ab":
        trained = s.trained(role) + (s.weights if carry else 0)
        count = s.layers + s.tensors_shared + (s.layers if carry else 0)
    else:
        trained = s.full + (factor if carry else 0)
        count = s.tensors_full + (s.layers if carry else 0)
    return _file(params, tensors, trained, count)


def rank_state_bytes(
    s: Sizes, evals: int = 0, factorizations: int = 0, cuda: bool = True, low_rank: bool = False
) -> int:
    """The small file every rank saves: its buffers (BatchNorm statistics differ between
    ranks), RNG states, the ledger's totals, the run record so far, and (a method with AB
    phases) the factors' shapes."""
    return (
        s.buffers
        + TENSOR_OVERHEAD * s.buffer_tensors
        + RNG_BYTES
        + (16 + TENSOR_OVERHEAD if cuda else 0)
        + LEDGER_TOTALS_BYTES
        + TIMES_BYTES
        + EVAL_RECORD_BYTES * evals
        + factorizations * (RANK_RECORD_BYTES * s.layers + FACTORIZATION_BYTES)
        + (SHAPE_RECORD_BYTES * s.layers if low_rank else 0)
        + FILE_OVERHEAD
    )


def _buckets(nbytes: int, cfg: Config) -> int:
    """DDP gradient buckets of `nbytes` (bucket_cap_mb is in MiB, as DDP reads it)."""
    cap = methods.make(cfg.method).bucket_cap_mb(cfg, cfg.dist.backend)
    return max(1, math.ceil(nbytes / (cap * 2**20)))


def ledger_calls(
    cfg: Config, s: Sizes, groups_: list[tuple[list[int], str]], world: int, ranks_per_node: int
) -> dict[tuple[int, str, str], int]:
    """The trainer's loop walked without training: collectives summed over ranks for each
    (step, phase, op), as ledger.csv counts them. Its keys are ledger.csv's rows; the sum
    of its values is the number of per-collective rows (ledger.jsonl)."""
    calls: dict[tuple[int, str, str], int] = {}
    # a broadcast to every rank in two hops (groups.Fanout): one rank per node, then nodes
    nodes = world // ranks_per_node
    fanout = (nodes if nodes > 1 else 0) + (world if ranks_per_node > 1 else 0)
    dtypes = 2 if s.buffer_tensors > s.float_buffers else 1  # BatchNorm's int counters

    def add(step: int, phase: str, op: str, count: int = world) -> None:
        calls[step, phase, op] = calls.get((step, phase, op), 0) + count

    def checkpoint(step: int) -> None:
        add(step, "checkpoint", "all_reduce", 2 * world)  # saved/stop flag; the ledger's flush

    roles = [role for ranks, role in groups_ for _ in ranks]
    full_buckets = _buckets(s.full, cfg)
    ab_buckets = sum(_buckets(s.trained(r), cfg) for r in roles)

    def sync(step: int) -> None:
        if len(groups_) == 1:  # one group trained by DDP: only float buffers differ
            if s.float_buffers:
                add(step, "sync", "all_reduce")
        elif cfg.ab.sync_mode == "rank0":  # rank 0's state, a dtype at a time
            add(step, "sync", "broadcast", dtypes * fanout)
        elif cfg.ab.sync_mode == "with_stale":
            add(step, "sync", "all_reduce")
        else:  # learners' all-reduce and the rest over the world; A and B shared
            add(step, "sync", "all_reduce", 2 * world)
            add(step, "sync", "broadcast", 2 * fanout)

    add(0, "setup", "all_gather")  # the node map
    add(0, "setup", "broadcast")  # whether tracking could start
    prev, pending = None, False
    compressing, full_rank_steps = methods.kind(cfg.method).compresses, 0
    for t in range(cfg.steps):
        phase = schedule.phase_at(t, cfg)
        if phase != prev:
            if prev is not None and prev.low_rank:
                sync(t)
            if phase.low_rank:
                add(t, "factorize", "all_reduce")
            if prev is None:
                # the first wrap: rank 0's state, or DDP's own broadcast inside each group
                add(t, phase.kind, "broadcast", world if phase.low_rank else dtypes * fanout)
            prev = phase
        if pending and not phase.low_rank:
            add(t, "eval", "all_reduce")
            pending = False
        if phase.low_rank:
            add(t, phase.kind, "all_reduce", ab_buckets)
        elif compressing and full_rank_steps >= cfg.powersgd.start_iter:
            add(t, phase.kind, "all_reduce", 3 * full_buckets * world)  # the rest, P, Q
        else:
            add(t, phase.kind, "all_reduce", full_buckets * world)
        full_rank_steps += not phase.low_rank
        if cfg.dist.sync_batchnorm == "group" and s.batchnorm_layers:
            add(t, phase.kind, "all_reduce", 2 * s.batchnorm_layers * world)
        elif cfg.dist.sync_batchnorm == "world" and s.batchnorm_layers:
            add(t, phase.kind, "all_gather", s.batchnorm_layers * world)
            add(t, phase.kind, "all_reduce", s.batchnorm_layers * world)
        pending |= (t + 1) % cfg.eval_every == 0
        if cfg.checkpoint_every and (t + 1) % cfg.checkpoint_every == 0 and t + 1 < cfg.steps:
            checkpoint(t)
    end = cfg.steps  # what follows the last step is keyed to the step after it
    if prev.low_rank:
        sync(end)  # the run ends merged
    add(end, "eval", "all_reduce")
    checkpoint(end)
    return calls


def _ledger(calls: dict[tuple[int, str, str], int], cfg: Config, world: int) -> dict[str, Any]:
    per_step: dict[int, int] = {}
    for step, _, _ in calls:
        per_step[step] = per_step.get(step, 0) + 1
    collectives = sum(calls.values())
    # steps between flushes: checkpoint_every, or the whole run when only the end checkpoints
    window = min(cfg.checkpoint_every or cfg.steps + 1, cfg.steps + 1)
    return dict(
        rows=len(calls),
        rows_per_step_max=max(per_step.values()),
        csv_bytes=AGGREGATE_ROW_BYTES * len(calls),
        train_log_rows=cfg.steps,
        train_log_bytes=TRAIN_LOG_ROW_BYTES * cfg.steps,
        # every rank's (rank 0's too): the tables of the steps since the last flush, the
        # same at step 10 and at 90,000; the flush all-reduces them (window x table)
        memory_bytes_per_rank=window * (STEP_TABLE_BYTES + PENDING_STEP_OVERHEAD),
        flush_bytes=window * STEP_TABLE_BYTES,
        # only if per-collective rows are switched on (tracking.ledger_rows): in all, and
        # what one rank holds until a flush
        per_collective_rows=collectives,
        per_collective_bytes=COLLECTIVE_ROW_BYTES * collectives,
        per_collective_memory_bytes_per_rank=ROW_MEMORY
        * collectives
        * window
        // cfg.steps
        // world,
    )


def _memory(cfg: Config, s: Sizes, roles: set[str]) -> dict[str, dict[str, int]]:
    """Model and optimizer bytes per GPU as the trainer holds them (activations, autocast
    copies and optimizer temporaries not included): fp32 parameters, gradients, DDP's
    bucket buffers (a second copy of the gradients: gradient_as_bucket_view is off) and
    AdamW's two moments. A factorised layer keeps W, frozen, through its AB phases, and A
    and B (their shapes tell the last rank) through the full-rank phases after; with
    ab.optimizer_state=carry the moments of W, and of the factor a rank trained, stay too.
    """

    def entry(params: int, grads: int, moments: int, extra: int = 0) -> dict[str, int]:
        out = dict(params=params, grads=grads, ddp_buckets=grads, moments=moments)
        if extra:
            out["powersgd_error"] = extra
        out["total"] = sum(out.values())
        return out

    compressing = methods.kind(cfg.method).compresses
    error = s.full if compressing and cfg.powersgd.error_feedback else 0
    out = {"full": entry(s.full, s.full, 2 * s.full, error)}
    if not roles:
        return out
    carry = cfg.ab.optimizer_state == "carry"

    def worst(entries: list[dict[str, int]]) -> dict[str, int]:
        return max(entries, key=lambda e: e["total"])

    factor = {"a": s.a, "b": s.b}
    out["ab"] = worst(
        [
            entry(
                s.full + s.a + s.b,
                s.trained(r),
                2 * s.trained(r) + (2 * s.weights if carry else 0),
            )
            for r in roles
        ]
    )
    out["rebound"] = worst(
        [
            entry(s.full + s.a + s.b, s.full, 2 * s.full + (2 * factor[r] if carry else 0))
            for r in roles
        ]
    )
    return out


def footprint(
    cfg: Config,
    nodes: int,
    ranks_per_node: int,
    classes: int,
    keep: float = 1.0,
    cuda: bool = True,
) -> Footprint:
    """Memory per GPU, checkpoint bytes and disk, ledger and log records of one run.

    Checkpoints as the trainer writes them: one replica per distinct state (one until
    the first factorisation; then one per A/B group, in every phase, since each group's
    factors keep AdamW moments of their own) plus every rank's small state;
    `keep_checkpoints` of them on disk, sized by the worst phase.
    """
    world = nodes * ranks_per_node
    s = sizes(cfg, classes, keep)
    groups_ = ab_groups(cfg, world, ranks_per_node)
    roles = {role for _, role in groups_}
    carry = cfg.ab.optimizer_state == "carry"
    at = checkpoint_steps(cfg)
    cycles = len({p.cycle for t in range(cfg.steps) if (p := schedule.phase_at(t, cfg)).low_rank})
    # the last checkpoint's run record is the largest: every evaluation and factorisation
    low_rank = methods.kind(cfg.method).low_rank
    small = world * rank_state_bytes(s, count_evaluations(cfg), cycles, cuda, low_rank)
    kept = min(cfg.keep_checkpoints, len(at))
    by_phase = {"full": replica_bytes(s) + small}
    for phase in ("ab", "rebound") if groups_ else ():
        by_phase[phase] = small + sum(saved_replica_bytes(s, phase, r, carry) for _, r in groups_)
    worst = max(by_phase.values())
    checkpoint = dict(
        replicas=len(groups_) or 1,
        bytes_by_phase=by_phase,
        bytes=worst,
        count=len(at),
        # the last is always merged; the others fall where the schedule puts them
        in_ab_phase=sum(schedule.phase_at(t - 1, cfg).low_rank for t in at[:-1]),
        kept=kept,
        disk_bytes=kept * worst,
    )
    return Footprint(
        memory=_memory(cfg, s, roles),
        checkpoint=checkpoint,
        ledger=_ledger(ledger_calls(cfg, s, groups_, world, ranks_per_node), cfg, world),
    )
