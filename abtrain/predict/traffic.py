"""The bytes a run sends, without training it: the ledger's rules applied analytically.

From a config (model, schedule, method), a node count and ranks per node, the inter-node
bytes each rank sends, in total and per step and phase, for the ring/chain wire model of
`abtrain.distributed.ledger` (`plan`), with the model's sizes (`sizes`). The ranks of the factorised
layers are what training decides; the prediction takes them as an assumption: a fraction
of each layer's full rank (`keep`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from abtrain import models
from abtrain.config import Config
from abtrain.distributed.ledger import STEP_TABLE_BYTES
from abtrain.method import lowrank, methods, schedule


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
    weights = {id(layer.w) for layer in layers.values()}
    a = b = 0
    for layer in layers.values():
        rows, cols = layer.w.shape[0], layer.w[0].numel()
        k = max(1, round(keep * min(rows, cols)))
        (long, _), (_, short) = lowrank.factor_shapes(layer.w.shape, k)
        a, b = a + 4 * long * k, b + 4 * k * short
    out = Sizes(
        params=sum(p.numel() for p in params),
        full=full,
        shared=full - 4 * sum(layer.w.numel() for layer in layers.values()),
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
    """As the trainer does them: due every eval_every steps, put off to the next step at
    which the replicas agree (`schedule.merged_at`: the end of an AB or local phase; several
    due in one phase make one), and one at the very end."""
    count, pending = 1, False
    for t in range(cfg.steps):
        if pending and schedule.merged_at(t, cfg):
            count, pending = count + 1, False
        pending |= (t + 1) % cfg.eval_every == 0
    return count


def checkpoint_steps(cfg: Config) -> list[int]:
    """Step counts at which the trainer checkpoints: every checkpoint_every, and the end."""
    every = cfg.checkpoint_every
    return [*(range(every, cfg.steps, every) if every else ()), cfg.steps]


@dataclass
class Estimate:
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


def estimate(
    cfg: Config, nodes: int, ranks_per_node: int, classes: int, keep: float = 1.0
) -> Estimate:
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
    if method.local:  # DDP inside each node between averages: nothing crosses but these
        kinds = [schedule.phase_at(t, cfg) for t in range(cfg.steps)]
        steps = {k: sum(p.kind == k for p in kinds) for k in ("warmup", "local", "rebound")}
        # each local phase ends in one all-reduce of every parameter (DiLoCo: its
        # pseudo-gradient) and float buffer over the world; the last at the run's end
        syncs = len({p.cycle for p in kinds if p.kind == "local"})
        events["sync"] = syncs * ring(full + s.float_buffer_bytes)
        full_rank = ring(full) + norm  # the warm-up and (schedule: ab) the rebounds
        step = {"warmup": full_rank, "local": ab_norm, "rebound": full_rank}
        return Estimate(steps, step, events, syncs)
    if not method.low_rank and not method.compresses:
        return Estimate({"full": cfg.steps}, {"full": ring(full) + norm}, events)
    if not method.low_rank:  # PowerSGD
        start = min(cfg.powersgd.start_iter, cfg.steps)
        return Estimate(
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
    return Estimate(steps, step, events, syncs=cycles)


def buffer_broadcast(cfg: Config, nodes: int, ranks_per_node: int, classes: int) -> dict:
    """What DDP's `broadcast_buffers` (torch's default, on in the authors' runs) would send
    and abtrain does not: before every forward pass, the first rank of the step's DDP group
    sends every buffer (BatchNorm's running statistics and counters) to the group. Returns
    the bytes of one broadcast and the mean inter-node bytes per rank per step of the run.
    abtrain leaves it off: its full-rank replicas agree without it, synced or local batch
    norm alike (the running statistics are averaged at each sync)."""
    s, n = sizes(cfg, classes), nodes * ranks_per_node
    p = estimate(cfg, nodes, ranks_per_node, classes)
    per_step = {k: chain_inter(s.buffers, nodes, n) for k in p.steps}
    groups_ = ab_groups(cfg, n, ranks_per_node)
    if "ab" in p.steps and groups_:
        members = groups_[0][0]
        spanned = len({r // ranks_per_node for r in members})
        per_step["ab"] = chain_inter(s.buffers, spanned, len(members))
    total = sum(p.steps[k] * per_step[k] for k in p.steps)
    return dict(bytes=s.buffers, inter_bytes_per_step=total / p.total_steps)


def authors_w_allreduce(cfg: Config, nodes: int, ranks_per_node: int, classes: int) -> dict:
    """What the authors' code at c3dbc10 sent at each sync and abtrain does not: a misspelt
    parameter name (`full_rank_sync_name`) left its list of layers synced as usual empty,
    which put every parameter in the always-averaged list, so each sync also all-reduced
    every factorised layer's frozen W, whose average the merge then overwrote (W = A·B).
    Fixed at c23240c. Returns the bytes of W and the inter-node bytes per rank of that one
    extra all-reduce per sync, and how many syncs the run has."""
    s, n = sizes(cfg, classes), nodes * ranks_per_node
    syncs = len({p.cycle for t in range(cfg.steps) if (p := schedule.phase_at(t, cfg)).low_rank})
    return dict(
        bytes=s.weights,
        inter_bytes_per_sync=ring_inter(s.weights, nodes, n),
        syncs=syncs,
    )


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


def ab_groups(cfg: Config, world: int, ranks_per_node: int) -> list[tuple[list[int], str]]:
    """The A/B groups the trainer forms (local SGD's and DiLoCo's: its nodes, each with
    the role 'local'; [] for methods without either)."""
    method = methods.make(cfg.method)
    return method.group_roles(world, method.group_size(cfg, world, ranks_per_node))
