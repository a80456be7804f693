"""Model registry: build a model from the config, identically on every rank."""

from __future__ import annotations

import torch
from torch import nn
from torchvision.models import resnet50

from abtrain.config import Config
from abtrain.models.init import ortho_sigma_
from abtrain.models.mlp import MLP
from abtrain.models.vgg import build_vgg16
from abtrain.models.vit import ViT


def build(cfg: Config, classes: int, features: int = 0) -> nn.Module:
    """Seeded from `cfg.seed`, so every rank builds the same weights without a broadcast."""
    torch.manual_seed(cfg.seed)
    m = cfg.model
    if m.name == "mlp":
        model = MLP(features, m.width, m.depth, classes)
    elif m.name == "vit":
        model = ViT(
            m.image_size,
            m.patch_size,
            m.width,
            m.depth,
            m.heads,
            m.mlp_ratio,
            m.qkv_bias,
            classes,
            m.drop_path,
        )
    elif m.name == "resnet50":
        model = resnet50(weights=None, num_classes=classes, zero_init_residual=m.zero_init_last)
        # timm's drop_rate: dropout before the classifier (state_dict keys unchanged)
        model.avgpool = nn.Sequential(model.avgpool, nn.Dropout(m.dropout))
    elif m.name == "vgg16":
        model = build_vgg16(m.layout, classes, m.dropout, m.width)
    else:
        raise ValueError(f"model.name: unknown model {m.name!r}")
    if m.init == "ortho_sigma":
        ortho_sigma_(model)
    return model
