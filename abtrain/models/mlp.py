"""A small MLP: the built-in model for runs on generated data."""

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
