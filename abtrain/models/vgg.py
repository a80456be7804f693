"""VGG16 (no batch norm) in torchvision's layout or in timm's, which the authors used.

timm's classifier starts with a 7×7 conv over the features adaptively pooled *up* to 7×7;
on 32×32 CIFAR images the features are 1×1, so that conv (102.8M of ~134M parameters)
sees a spatially constant input and compresses extremely well: the paper's 44:1.

`width` is the first stage's channels: 64 is VGG16 as published (built by torchvision, so
the weights are exactly torchvision's); another width scales every stage and the 4096-wide
classifier alike (a miniature of the same layout, e.g. for CI on CPUs).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.models import vgg16
from torchvision.models.vgg import cfgs, make_layers

VGG16_WIDTH = 64


def _features(width: int) -> nn.Sequential:
    if width == VGG16_WIDTH:
        return vgg16(weights=None).features
    stages = [v if v == "M" else v * width // VGG16_WIDTH for v in cfgs["D"]]
    features = make_layers(stages)
    for m in features.modules():  # torchvision's init
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            nn.init.zeros_(m.bias)
    return features


class TimmVGG16(nn.Module):
    def __init__(self, classes: int, dropout: float, width: int = VGG16_WIDTH) -> None:
        super().__init__()
        channels, hidden = 8 * width, 64 * width  # 512 and 4096 at width 64
        self.features = _features(width)
        self.pre_logits = nn.Sequential(
            nn.Conv2d(channels, hidden, 7),
            nn.ReLU(inplace=True),
            nn.Dropout(dropout),
            nn.Conv2d(hidden, hidden, 1),
            nn.ReLU(inplace=True),
        )
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.features(x)
        if x.shape[-1] < 7 or x.shape[-2] < 7:
            x = F.adaptive_avg_pool2d(x, 7)
        x = self.pre_logits(x)
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


class TorchvisionVGG16(nn.Module):
    """torchvision's VGG16 (same module names) at another width."""

    def __init__(self, classes: int, dropout: float, width: int) -> None:
        super().__init__()
        hidden = 64 * width
        self.features = _features(width)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(8 * width * 7 * 7, hidden),
            nn.ReLU(True),
            nn.Dropout(dropout),
            nn.Linear(hidden, hidden),
            nn.ReLU(True),
            nn.Dropout(dropout),
            nn.Linear(hidden, classes),
        )
        for m in self.classifier.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


def build_vgg16(layout: str, classes: int, dropout: float, width: int = VGG16_WIDTH) -> nn.Module:
    if layout == "timm":
        return TimmVGG16(classes, dropout, width)
    if width == VGG16_WIDTH:
        return vgg16(weights=None, num_classes=classes, dropout=dropout)
    return TorchvisionVGG16(classes, dropout, width)
