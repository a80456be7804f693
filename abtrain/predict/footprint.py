"""What a run keeps, without training it: model and optimizer memory per GPU by phase,
checkpoint bytes and disk, ledger and log records (`footprint`), from the model's sizes
(abtrain.predict.traffic) and what the ledger, the results and the checkpointer write (measured
overheads below).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from abtrain.config import Config
from abtrain.distributed.ledger import STEP_TABLE_BYTES
from abtrain.method import methods, schedule
from abtrain.predict.traffic import Sizes, ab_groups, checkpoint_steps, count_evaluations, sizes

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


# ---------------------------------------------------------------- what the run keeps
@dataclass
class Footprint:
    """What a run keeps in memory and on disk; bytes unless named otherwise."""

    memory: dict[str, dict[str, int]]  # per GPU, by phase: params, grads, ... total
    checkpoint: dict[str, Any]
    ledger: dict[str, Any]


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
        if methods.kind(cfg.method).local:  # every parameter (DiLoCo: its pseudo-gradient)
            add(step, "sync", "all_reduce")
        elif len(groups_) == 1:  # one group trained by DDP: only float buffers differ
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
            if prev is not None and prev.grouped:
                sync(t)
            if phase.low_rank:
                add(t, "factorize", "all_reduce")
            if prev is None:
                # the first wrap: rank 0's state, or DDP's own broadcast inside each group
                add(t, phase.kind, "broadcast", world if phase.grouped else dtypes * fanout)
            prev = phase
        if pending and schedule.merged_at(t, cfg):
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
    if prev.grouped:
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
    if cfg.method == "diloco":  # the outer weights and their momentum, a copy each
        out["full"]["outer"] = 2 * s.full
        out["full"]["total"] += 2 * s.full
    if not roles or methods.kind(cfg.method).local:
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
    local = methods.kind(cfg.method).local
    if local:  # each node's replica: its own inner moments (and DiLoCo's outer state)
        outer = 2 * s.full if cfg.method == "diloco" else 0
        by_phase = {"full": replica_bytes(s) + outer + small}
        by_phase["local"] = small + len(groups_) * (replica_bytes(s) + outer)
    for phase in ("ab", "rebound") if groups_ and not local else ():
        by_phase[phase] = small + sum(saved_replica_bytes(s, phase, r, carry) for _, r in groups_)
    worst = max(by_phase.values())
    checkpoint = dict(
        replicas=len(groups_) or 1,
        bytes_by_phase=by_phase,
        bytes=worst,
        count=len(at),
        # the last is always merged; the others fall where the schedule puts them
        in_ab_phase=sum(schedule.phase_at(t - 1, cfg).grouped for t in at[:-1]),
        kept=kept,
        disk_bytes=kept * worst,
    )
    return Footprint(
        memory=_memory(cfg, s, roles),
        checkpoint=checkpoint,
        ledger=_ledger(ledger_calls(cfg, s, groups_, world, ranks_per_node), cfg, world),
    )
