"""The collectives around the factors: agreeing their rank at a factorisation, and at the
end of an AB phase averaging A and B across the workers before W = A·B.

`with_stale` (the paper's): every rank's A and B, trained or frozen, averaged over the
world, which halves each group's update. `only_learned`: A averaged over the A ranks, B
over the B ranks, then each shared with everyone. Parameters that are never factorised,
and float buffers, are averaged over the world either way. `rank0` (the authors' "no
groups" at c3dbc10, whose sync averaged nothing through a misspelt parameter name): every
rank takes rank 0's parameters and buffers, as the world DDP wrap that followed broadcast
them; each rank keeps its own optimizer moments, as there.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn

from abtrain.distributed.groups import ABGroups, Fanout
from abtrain.distributed.ledger import Ledger
from abtrain.method import lowrank
from abtrain.method.lowrank import LowRankLayer


@torch.no_grad()
def factorize_layers(
    layers: dict[str, LowRankLayer],
    sigma_cutoff: float,
    role: str,
    ledger: Ledger,
    split_sigma: bool = True,
) -> dict[str, int]:
    """Split every W into A·B; this rank then trains `role`. Returns the rank of each layer.

    Each rank picks k from its own σ; the maximum over the world is kept, so every replica
    has the same shapes even where σ differ. Without `split_sigma` the trained factor takes
    all of Σ (the authors' "no groups", where every rank trains B).
    """
    svds = [lowrank.svd(layer.w) for layer in layers.values()]
    ks = lowrank.keep_ranks([s for _, s, _ in svds], sigma_cutoff)
    ledger.all_reduce(ks, op=dist.ReduceOp.MAX)
    for layer, (u, s, vh), k in zip(layers.values(), svds, ks.tolist()):
        a, b = lowrank.split(u, s, vh, k, "both" if split_sigma else role)
        layer.set_factors(a.to(layer.w.dtype), b.to(layer.w.dtype), role)
    return dict(zip(layers, ks.tolist()))


def shared_params(model: nn.Module, layers: dict[str, LowRankLayer]) -> list[nn.Parameter]:
    """Parameters never factorised: biases, norms, tokens, full-rank layers."""
    factor_ids = {id(t) for layer in layers.values() for t in (layer.w, layer.a, layer.b)}
    return [p for p in model.parameters() if id(p) not in factor_ids]


def shared_state(model: nn.Module, layers: dict[str, LowRankLayer]) -> list[Tensor]:
    """Shared parameters and float buffers (integer ones, BN's batch counters, stay)."""
    buffers = [b for b in model.buffers() if b.is_floating_point()]
    return [t.data for t in shared_params(model, layers) + buffers]


def _flat(tensors: list[Tensor]) -> Tensor:
    """One buffer for one collective instead of one per tensor."""
    return torch.cat([t.reshape(-1) for t in tensors])


def _pieces(flat: Tensor, tensors: list[Tensor]) -> list[Tensor]:
    """`flat` cut back into views shaped like `tensors`."""
    return [p.view_as(t) for p, t in zip(flat.split([t.numel() for t in tensors]), tensors)]


def average_tensors(tensors: list[Tensor], ledger: Ledger, group=None) -> None:
    """Average `tensors` in place over `group` with one all-reduce."""
    if not tensors:
        return
    flat = _flat(tensors)
    ledger.all_reduce(flat, group)
    flat.div_(dist.get_world_size(group))
    for t, avg in zip(tensors, _pieces(flat, tensors)):
        t.copy_(avg)


def share(tensors: list[Tensor], ledger: Ledger, route: Fanout) -> None:
    """Give every rank `route.root`'s `tensors` (one dtype), across nodes first."""
    if not tensors:
        return
    flat = _flat(tensors)
    if route.across is not None:
        ledger.broadcast(flat, route.root, route.across)
    if route.within is not None:
        ledger.broadcast(flat, route.local_root, route.within)
    for t, new in zip(tensors, _pieces(flat, tensors)):
        t.copy_(new)


@torch.no_grad()
def share_model(model: nn.Module, ledger: Ledger, route: Fanout, skip: list[Tensor] = ()) -> None:
    """`route.root`'s parameters and buffers (but `skip`) to every rank, a dtype at a time."""
    by_dtype: dict[torch.dtype, list[Tensor]] = {}
    left_out = {id(t) for t in skip}
    for t in [*model.parameters(), *model.buffers()]:
        if id(t) not in left_out:
            by_dtype.setdefault(t.dtype, []).append(t.data)
    for tensors in by_dtype.values():
        share(tensors, ledger, route)


@torch.no_grad()
def average(
    model: nn.Module,
    layers: dict[str, LowRankLayer],
    groups: ABGroups,
    mode: str,
    ledger: Ledger,
    moments: list[Tensor] = (),
) -> None:
    """Average the factors as `mode` says; everything else, and the optimizer `moments` of
    the parameters every group trained, over the world. Without the moments the replicas
    would drift apart again in the full-rank steps that follow."""
    shared = shared_state(model, layers) + list(moments)
    a = [layer.a.data for layer in layers.values()]
    b = [layer.b.data for layer in layers.values()]
    if groups.single:
        # One group trained by DDP over the world: factors and parameters already agree,
        # only buffers (updated locally, never all-reduced) differ.
        average_tensors([t for t in model.buffers() if t.is_floating_point()], ledger)
    elif mode == "with_stale":
        average_tensors(a + b + shared, ledger)
    elif mode == "only_learned":
        average_tensors(a if groups.role == "a" else b, ledger, groups.learners)
        share(a, ledger, groups.share_a)
        share(b, ledger, groups.share_b)
        average_tensors(shared, ledger)
    else:
        raise ValueError(f"unknown sync mode {mode!r}")


@torch.no_grad()
def take_rank0(
    model: nn.Module, layers: dict[str, LowRankLayer], ledger: Ledger, route: Fanout
) -> None:
    """Sync mode `rank0`: W = A·B on every rank, then rank 0's W, other parameters and
    buffers to all (the factors stay: A is every rank's same SVD, B is in W)."""
    merge(layers)
    share_model(model, ledger, route, skip=[t for m in layers.values() for t in (m.a, m.b)])


@torch.no_grad()
def average_replicas(model: nn.Module, ledger: Ledger) -> None:
    """Local SGD's average: every parameter and float buffer over the world, in one
    all-reduce (the optimizer's moments stay each node's own)."""
    buffers = [b for b in model.buffers() if b.is_floating_point()]
    average_tensors([p.data for p in model.parameters()] + buffers, ledger)


def merge(layers: dict[str, LowRankLayer]) -> None:
    for layer in layers.values():
        layer.merge()
