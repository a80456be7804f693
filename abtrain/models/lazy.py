"""Lazy layers (nn.LazyLinear and the like) get their shapes from a first forward pass."""

from __future__ import annotations

import itertools

import torch
from torch import nn
from torch.nn.parameter import is_lazy


def has_lazy(model: nn.Module) -> bool:
    """Whether any parameter or buffer is still uninitialised (UninitializedParameter)."""
    return any(is_lazy(t) for t in itertools.chain(model.parameters(), model.buffers()))


@torch.no_grad()
def materialize(model: nn.Module, input_shape: tuple[int, ...]) -> None:
    """Give every lazy layer its shape and weights by one forward pass of zeros.

    In eval mode, so that no batch statistics are updated and no dropout draws from the
    generator: the lazy layers' own inits are then the only draws, in model order, and
    every rank seeded alike gets the same weights. Nothing happens for a model without
    lazy layers (most: no forward pass, no draws).
    """
    if not has_lazy(model):
        return
    device = next(itertools.chain(model.parameters(), model.buffers())).device
    training = model.training
    model.eval()
    try:
        # two samples: a model that squeezes its batch dimension still sees a batch
        model(torch.zeros(2, *input_shape, device=device))
    finally:
        model.train(training)
    left = [
        name
        for name, t in itertools.chain(model.named_parameters(), model.named_buffers())
        if is_lazy(t)
    ]
    if left:  # a branch the forward pass didn't take: its shape is still unknown
        raise ValueError(f"lazy parameters that one forward pass did not materialise: {left}")
