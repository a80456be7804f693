"""The authors' "ortho-sigma" initialisation: every weight set to its polar factor."""

from __future__ import annotations

import torch
from torch import nn

from abtrain.method import lowrank


@torch.no_grad()
def ortho_sigma_(model: nn.Module) -> None:
    """Set every parameter with 2+ dims to U·Vᵀ of its SVD (all singular values 1).

    Deterministic given the weights, so identical on every rank that built them alike.
    """
    for p in model.parameters():
        if p.dim() < 2:
            continue
        u, _, vh = lowrank.svd(p)  # of the upright float32 view (float64 where LAPACK fails)
        polar = u @ vh
        polar = polar.t() if lowrank.is_wide(p.shape) else polar
        p.copy_(polar.reshape(p.shape).to(p.dtype))
