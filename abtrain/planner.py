"""Traffic without training: the ledger's rules applied analytically.

From a config (model, schedule, method), a node count and ranks per node, predict the
inter-node bytes each rank sends, in total and per step, for the ring/chain wire model of
`abtrain.ledger`. The ranks of the factorised layers are what training decides; the
planner takes them as an assumption: a fraction of each layer's full rank (`keep`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from abtrain import lowrank, models, schedule
from abtrain.config import Config


@dataclass
class Plan:
    inter_bytes: float  # per rank over the run
    steps: int

    @property
    def per_step(self) -> float:
        return self.inter_bytes / self.steps


def ring_inter(size: float, nodes: int, ranks: int) -> float:
    """Mean inter-node bytes per rank of a ring all-reduce of `size` bytes over contiguous
    ranks on `nodes` nodes: every rank sends 2(n-1)/n·S, and `nodes` ring edges cross."""
    if nodes < 2:
        return 0.0
    return 2 * (ranks - 1) / ranks * size * nodes / ranks


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


def plan(cfg: Config, nodes: int, ranks_per_node: int, classes: int, keep: float = 1.0) -> Plan:
    n = nodes * ranks_per_node
    with torch.device("meta"):
        model = models.build(cfg, classes, getattr(cfg.data, "features", 0))
    full = 4 * sum(p.numel() for p in model.parameters())
    inter = 3 * 8 * nodes / n if nodes > 1 else 0.0  # node map (all-gather, ring)
    inter += chain_inter(8, nodes, n) + chain_inter(full, nodes, n)  # tracking flag, first wrap
    evals = count_evaluations(cfg)
    inter += evals * ring_inter(32, nodes, n)
    ckpts = (
        len(range(cfg.checkpoint_every, cfg.steps, cfg.checkpoint_every))
        if cfg.checkpoint_every
        else 0
    ) + 1
    inter += ckpts * ring_inter(8, nodes, n)
    kinds = [schedule.phase_at(t, cfg).kind for t in range(cfg.steps)]
    if cfg.method == "ddp":
        return Plan(inter + cfg.steps * ring_inter(full, nodes, n), cfg.steps)
    if cfg.method == "powersgd":
        r, compressed = cfg.powersgd.rank, 0
        for p in model.parameters():
            rows, cols = p.shape[0], p.numel() // p.shape[0]
            k = min(rows, cols, r)
            compressed += (rows + cols) * k if (rows + cols) * k * 2 < rows * cols else rows * cols
        start = min(cfg.powersgd.start_iter, cfg.steps)
        return Plan(
            inter
            + start * ring_inter(full, nodes, n)
            + (cfg.steps - start) * ring_inter(4 * compressed, nodes, n),
            cfg.steps,
        )
    layers = lowrank.convert(model, cfg.ab.full_rank_layers)
    shared = full - 4 * sum(layer.weight.numel() for layer in layers.values())
    a_bytes = b_bytes = 0
    for layer in layers.values():
        rows, cols = layer.weight.shape[0], layer.weight[0].numel()
        k = max(1, round(keep * min(rows, cols)))
        a_bytes, b_bytes = a_bytes + 4 * rows * k, b_bytes + 4 * k * cols
    inter += kinds.count("warmup") * ring_inter(full, nodes, n)
    inter += kinds.count("rebound") * ring_inter(full, nodes, n)
    cycles = len({schedule.phase_at(t, cfg).cycle for t in range(cfg.steps) if kinds[t] == "ab"})
    inter += cycles * ring_inter(8 * len(layers), nodes, n)  # agreeing on k
    if cfg.method == "ab_nogroups":
        inter += kinds.count("ab") * ring_inter(b_bytes + shared, nodes, n)
    else:  # groups are nodes (or single ranks): nothing crosses inside an AB phase
        inter += cycles * ring_inter(a_bytes + b_bytes + 3 * shared, nodes, n)
    return Plan(inter, cfg.steps)
