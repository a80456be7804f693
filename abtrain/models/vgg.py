"""VGG16 (no batch norm) in torchvision's layout or in timm's, which the authors used.

timm's classifier starts with a 7×7 conv over the features adaptively pooled *up* to 7×7;
on 32×32 CIFAR images the features are 1×1, so that conv (102.8M of ~134M parameters)
sees a spatially constant input and compresses extremely well: the paper's 44:1.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.models import vgg16


class TimmVGG16(nn.Module):
    def __init__(self, classes: int, dropout: float) -> None:
        super().__init__()
        self.features = vgg16(weights=None).features
        self.pre_logits = nn.Sequential(
            nn.Conv2d(512, 4096, 7),
            nn.ReLU(inplace=True),
            nn.Dropout(dropout),
            nn.Conv2d(4096, 4096, 1),
            nn.ReLU(inplace=True),
        )
        self.head = nn.Linear(4096, classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.features(x)
        if x.shape[-1] < 7 or x.shape[-2] < 7:
            x = F.adaptive_avg_pool2d(x, 7)
        x = self.pre_logits(x)
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


def build_vgg16(layout: str, classes: int, dropout: float) -> nn.Module:
    if layout == "timm":
        return TimmVGG16(classes, dropout)
    return vgg16(weights=None, num_classes=classes, dropout=dropout)
