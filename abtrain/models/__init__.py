"""Build a model from the config, identically on every rank.

Three kinds (`model.name`): `mlp`, abtrain's own small MLP for synthetic data; `timm`, any
timm architecture by name (the paper's ViT-B/16, ResNet-50 and VGG16 are timm's, as the
authors trained them); `python`, a user's own factory "package.module:function".
"""

from __future__ import annotations

import torch
from torch import nn

from abtrain.config import Config, ConfigError, ImageData, model_label
from abtrain.models.init import ortho_sigma_
from abtrain.models.lazy import materialize
from abtrain.models.mlp import MLP


def input_shape(cfg: Config, features: int = 0) -> tuple[int, ...]:
    """One sample's shape: 3 × image_size × image_size, or the synthetic data's features."""
    if isinstance(cfg.data, ImageData):
        return (3, cfg.data.image_size, cfg.data.image_size)
    return (features or cfg.data.features,)


def build(cfg: Config, classes: int, features: int = 0) -> nn.Module:
    """Seeded from `cfg.seed`, so every rank builds the same weights without a broadcast:
    the factory's draws, then those of lazy layers materialised by a forward pass of zeros
    (shaped as `input_shape`), then the init, all in one order on every rank."""
    from abtrain.models import factory

    torch.manual_seed(cfg.seed)
    m = cfg.model
    if m.name == "mlp":
        model = MLP(features, m.width, m.depth, classes)
    elif m.name == "timm":
        model = factory.timm_model(m.arch, classes, m.kwargs)
    elif m.name == "python":
        model = factory.python_model(m.factory, classes, m.kwargs)
    else:
        raise ConfigError(f"model.name: unknown model {m.name!r}")
    shape = input_shape(cfg, features)
    try:
        materialize(model, shape)
    except Exception as err:
        raise ConfigError(
            f"model: its lazy layers could not be materialised by a forward pass of zeros "
            f"shaped (batch, {', '.join(map(str, shape))}) (the data's sample shape): {err}"
        ) from err
    if m.init == "ortho_sigma":
        ortho_sigma_(model)
    return model


label = model_label  # torch-free, in config: `compare` uses it without torch
