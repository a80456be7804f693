"""A small MLP: the built-in model for runs on generated data (`data.name: synthetic`).

Kept beside timm because most tests and the quick checks (scripts/same-bits.sh, the
benchmarks' tiny runs) train it: it builds in milliseconds, needs no images and no timm
import, and its few layers make every phase of AB training visible in a 40-step run.
"""

from __future__ import annotations

from torch import Tensor, nn


class MLP(nn.Module):
    def __init__(self, features: int, width: int, depth: int, classes: int) -> None:
        super().__init__()
        dims = [features] + [width] * depth
        self.layers = nn.ModuleList(nn.Linear(i, o) for i, o in zip(dims[:-1], dims[1:]))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = nn.functional.gelu(layer(x))
        return self.head(self.norm(x))
