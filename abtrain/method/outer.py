"""DiLoCo's outer step (Douillard et al. 2023, Algorithm 1): between two outer steps each
node trains with the run's own (inner) optimizer; at an outer step the pseudo-gradient,
the weights of the last outer step minus the node's, is averaged across the world and
applied to the last outer weights by SGD with Nesterov momentum. Every rank then continues
from the result; each node keeps its inner optimizer's moments.

The outer weights and the momentum are the same on every rank (they are computed from
all-reduced values only), so one rank's copy is the checkpoint's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from abtrain.distributed.ledger import Ledger
from abtrain.method import sync


class OuterStep:
    """The outer optimizer of `model`'s parameters: `begin()` where nodes start training on
    their own, `step()` at each average."""

    def __init__(self, model: nn.Module, lr: float, momentum: float) -> None:
        self.params = list(model.parameters())
        self.buffers = [b for b in model.buffers() if b.is_floating_point()]
        self.anchor = [p.detach().clone() for p in self.params]  # the last outer weights
        # (torch refuses Nesterov without momentum; with none, it is plain SGD either way)
        self.opt = torch.optim.SGD(self.anchor, lr=lr, momentum=momentum, nesterov=momentum > 0)

    @torch.no_grad()
    def begin(self) -> None:
        """The model's weights now are the outer weights (the warm-up's end)."""
        for a, p in zip(self.anchor, self.params):
            a.copy_(p)

    @torch.no_grad()
    def step(self, ledger: Ledger) -> None:
        """Average the pseudo-gradients (and the float buffers, BatchNorm's statistics) over
        the world in one all-reduce; one outer SGD step; every parameter set to its result."""
        deltas = pseudo_gradient(self.anchor, self.params)
        sync.average_tensors(deltas + [b.data for b in self.buffers], ledger)
        for a, d in zip(self.anchor, deltas):
            a.grad = d
        self.opt.step()
        for a, p in zip(self.anchor, self.params):
            a.grad = None
            p.copy_(a)

    def state_dict(self) -> dict[str, Any]:
        momentum = [self.opt.state.get(a, {}).get("momentum_buffer") for a in self.anchor]
        return dict(anchor=[a.clone() for a in self.anchor], momentum=momentum)

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        for a, saved in zip(self.anchor, state["anchor"], strict=True):
            a.copy_(saved)
        for a, m in zip(self.anchor, state["momentum"], strict=True):
            if m is None:
                self.opt.state.pop(a, None)
            else:
                self.opt.state[a] = {"momentum_buffer": m.to(a.device).clone()}


def pseudo_gradient(anchor: list[Tensor], params: list[Tensor]) -> list[Tensor]:
    """The last outer weights minus the node's (DiLoCo's Δ, before averaging)."""
    return [a - p for a, p in zip(anchor, params)]
