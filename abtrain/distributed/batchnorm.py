"""Batch statistics shared over a process group (SyncBatchNorm), on any device, counted.

torch's SyncBatchNorm runs on GPUs only and talks to `torch.distributed` directly, out of
the ledger's sight. This one sums each layer's (Σx, Σx², n) over the group with one
all-reduce forward and the gradients of those sums with one all-reduce backward, through
the ledger: the same statistics as one process with the group's whole batch, and every
rank of the group ends each step with the same running statistics.

`dist.sync_batchnorm: group`: the group is the one DDP spans in the phase (`attach`): the
world in full-rank phases, the rank's A/B group in AB phases, whose promise is to train
without talking across groups. `world`: the authors' runs (torch's SyncBatchNorm over the
world group, AB phases included) with torch's collectives: each rank's 2C+1 statistics
all-gathered forward, the 2C gradients of the sums all-reduced backward. Its cost grows
with the world (every rank receives every rank's statistics), and the ledger counts it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn

from abtrain.distributed.ledger import Ledger


class _SumOverGroup(torch.autograd.Function):
    """All-reduce (sum) forward; every rank's loss depends on the sum, so the gradient of
    each rank's part is the sum of the gradients too."""

    @staticmethod
    def forward(ctx, t: Tensor, group: dist.ProcessGroup | None, ledger: Ledger) -> Tensor:
        ctx.group, ctx.ledger = group, ledger
        out = t.clone()
        ledger.all_reduce(out, group)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        grad = grad.clone()
        ctx.ledger.all_reduce(grad, ctx.group)
        return grad, None, None


class _GatherOverGroup(torch.autograd.Function):
    """All-gather forward and sum in rank order (the same sum on every rank); backward,
    the gradients of the sums all-reduced, less the count's, which has none."""

    @staticmethod
    def forward(ctx, t: Tensor, group: dist.ProcessGroup | None, ledger: Ledger) -> Tensor:
        ctx.group, ctx.ledger = group, ledger
        return torch.stack(ledger.all_gather(t, group)).sum(0)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        sums = grad[:-1].clone()
        ctx.ledger.all_reduce(sums, ctx.group)
        return torch.cat([sums, grad.new_zeros(1)]), None, None


class SyncedBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm2d whose training statistics span a process group (same state_dict)."""

    group: dist.ProcessGroup | None = None
    ledger: Ledger | None = None
    gather: bool = False  # torch's collectives (all-gather forward), not two all-reduces

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.ledger is None:
            return super().forward(x)
        c = x.shape[1]
        x32 = x.float()
        local = torch.cat(
            [
                x32.sum((0, 2, 3)),
                (x32 * x32).sum((0, 2, 3)),
                x32.new_full((1,), x.numel() // c),
            ]
        )
        total = (_GatherOverGroup if self.gather else _SumOverGroup).apply(
            local, self.group, self.ledger
        )
        n = total[2 * c].detach()
        mean = total[:c] / n
        # biased, as batch norm normalises; rounding can take E[x²] - mean² just below 0
        var = (total[c : 2 * c] / n - mean * mean).clamp(min=0)
        with torch.no_grad():
            self.num_batches_tracked += 1
            m = self.momentum if self.momentum is not None else 1 / self.num_batches_tracked
            self.running_mean.lerp_(mean.to(self.running_mean.dtype), m)
            unbiased = var * n / (n - 1).clamp(min=1)
            self.running_var.lerp_(unbiased.to(self.running_var.dtype), m)
        scale = torch.rsqrt(var + self.eps) * self.weight
        y = (x32 - mean[None, :, None, None]) * scale[None, :, None, None]
        return (y + self.bias[None, :, None, None]).to(x.dtype)


def convert(model: nn.Module) -> int:
    """Make every BatchNorm2d of `model` a SyncedBatchNorm2d in place; returns how many.

    The module itself changes class (the subclass adds no state): its parameters stay the
    same objects, so an optimizer made before holds them still, as do its buffers and
    hooks."""
    count = 0
    for child in model.modules():
        if type(child) is nn.BatchNorm2d:
            child.__class__ = SyncedBatchNorm2d
            count += 1
    return count


def attach(model: nn.Module, group: dist.ProcessGroup | None, ledger: Ledger, mode: str) -> None:
    """Make every synced batch norm of `model` span the phase's `group` (mode 'group') or
    the world with torch's collectives (mode 'world'), counted by `ledger`."""
    for m in model.modules():
        if isinstance(m, SyncedBatchNorm2d):
            m.ledger, m.gather = ledger, mode == "world"
            m.group = None if m.gather else group
