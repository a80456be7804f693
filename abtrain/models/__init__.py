"""Model registry: build a model from the config, identically on every rank."""

from __future__ import annotations

import torch
from torch import nn

from abtrain.config import Config
from abtrain.models.init import ortho_sigma_
from abtrain.models.mlp import MLP


def build(cfg: Config) -> nn.Module:
    """Seeded from `cfg.seed`, so every rank builds the same weights without a broadcast."""
    torch.manual_seed(cfg.seed)
    m = cfg.model
    if m.name == "mlp":
        model = MLP(cfg.data.features, m.width, m.depth, cfg.data.classes)
    else:
        raise ValueError(f"model.name: unknown model {m.name!r}")
    if m.init == "ortho_sigma":
        ortho_sigma_(model)
    return model
