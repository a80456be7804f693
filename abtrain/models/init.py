"""The authors' "ortho-sigma" initialisation: every weight set to its polar factor."""

from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def ortho_sigma_(model: nn.Module) -> None:
    """Set every parameter with 2+ dims to U·Vᵀ of its SVD (all singular values 1).

    Deterministic given the weights, so identical on every rank that built them alike.
    """
    for p in model.parameters():
        if p.dim() < 2:
            continue
        m = p.reshape(p.shape[0], -1).float()
        u, _, vh = torch.linalg.svd(m, full_matrices=False)
        p.copy_((u @ vh).view_as(p).to(p.dtype))
