"""VGG16 at any width, from timm's own VGG classes: the authors' model and its miniatures.

The authors trained timm's `vgg16` on CIFAR-10: its classifier starts with a 7×7 conv over
the features adaptively pooled *up* to 7×7 (1×1 at 32 px), so that conv (102.8M of ~134M
parameters) sees a spatially constant input and compresses extremely well: the paper's 44:1.

timm's VGG scales its stages by its `cfg` list, but its classifier's 4096 channels are fixed
(`mlp_ratio` widens only the first conv of the two, and the head reads 4096 features in any
case). A miniature that keeps the model's proportions (CPU runs of Table 2, the paper
profile in miniature) needs every width scaled alike, so this factory scales the stages and
swaps in a ConvMlp and ClassifierHead of the scaled width, timm's own classes with timm's
init. Use it as `model: {name: python, factory: "abtrain.models.vgg:vgg16", kwargs: {width:
16, drop_rate: 0.0}}`; at width 64 it is timm's vgg16 exactly (the same bits at one seed).
"""

from __future__ import annotations

from torch import nn

from abtrain.config import ConfigError

VGG16_WIDTH = 64  # the first stage's channels in VGG16 as published


def vgg16(num_classes: int, width: int = VGG16_WIDTH, drop_rate: float = 0.0) -> nn.Module:
    """timm's VGG16 (no batch norm) with every stage and the 4096-wide classifier scaled by
    width/64; drop_rate: dropout in the classifier, timm's (the authors': 0)."""
    from timm.layers import ClassifierHead
    from timm.models.vgg import VGG, ConvMlp, cfgs

    if not isinstance(width, int) or isinstance(width, bool) or width < 1:
        raise ConfigError(f"model.kwargs.width: a positive whole number (64: VGG16), not {width!r}")
    if width == VGG16_WIDTH:  # as timm.create_model("vgg16") builds it, draw for draw
        return VGG(cfgs["vgg16"], num_classes=num_classes, drop_rate=drop_rate)
    stages = [v if v == "M" else v * width // VGG16_WIDTH for v in cfgs["vgg16"]]
    hidden = 4096 * width // VGG16_WIDTH
    model = VGG(stages, num_classes=num_classes, drop_rate=drop_rate)
    model.pre_logits = ConvMlp(model.num_features, hidden, 7, drop_rate=drop_rate)
    model.head = ClassifierHead(hidden, num_classes, pool_type="avg", drop_rate=drop_rate)
    model.head_hidden_size = hidden
    model._initialize_weights()  # timm's init over the swapped-in layers too
    return model
