"""Vision Transformer: the authors' mini-ViT and ViT-B/16 from one definition.

Module names follow timm's (patch_embed.proj, blocks.N.attn.qkv, head), so the qkv
projection is one fused Linear and is factorised as one matrix, as in the paper.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class PatchEmbed(nn.Module):
    def __init__(self, patch: int, width: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(3, width, patch, stride=patch)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


class Attention(nn.Module):
    def __init__(self, width: int, heads: int, qkv_bias: bool) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width, bias=qkv_bias)
        self.proj = nn.Linear(width, width)

    def forward(self, x: Tensor) -> Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        x = F.scaled_dot_product_attention(q, k, v)
        return self.proj(x.transpose(1, 2).reshape(b, n, c))


class Mlp(nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


def drop_path(x: Tensor, p: float, training: bool) -> Tensor:
    """Stochastic depth: drop a residual branch for whole samples, rescale the rest."""
    if p == 0 or not training:
        return x
    keep = x.new_empty(x.shape[0], *([1] * (x.dim() - 1))).bernoulli_(1 - p)
    return x * keep / (1 - p)


class Block(nn.Module):
    def __init__(
        self, width: int, heads: int, mlp_ratio: float, qkv_bias: bool, drop: float
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width, eps=1e-6)
        self.attn = Attention(width, heads, qkv_bias)
        self.norm2 = nn.LayerNorm(width, eps=1e-6)
        self.mlp = Mlp(width, int(width * mlp_ratio))
        self.drop = drop

    def forward(self, x: Tensor) -> Tensor:
        x = x + drop_path(self.attn(self.norm1(x)), self.drop, self.training)
        return x + drop_path(self.mlp(self.norm2(x)), self.drop, self.training)


class ViT(nn.Module):
    def __init__(
        self,
        image_size: int,
        patch_size: int,
        width: int,
        depth: int,
        heads: int,
        mlp_ratio: float,
        qkv_bias: bool,
        classes: int,
        drop_path: float = 0.0,
    ) -> None:
        super().__init__()
        tokens = (image_size // patch_size) ** 2
        self.patch_embed = PatchEmbed(patch_size, width)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, width))
        self.pos_embed = nn.Parameter(torch.randn(1, tokens + 1, width) * 0.02)
        # as timm: the drop-path rate rises linearly from 0 to `drop_path` over the blocks
        rates = [drop_path * i / max(1, depth - 1) for i in range(depth)]
        self.blocks = nn.Sequential(
            *(Block(width, heads, mlp_ratio, qkv_bias, rate) for rate in rates)
        )
        self.norm = nn.LayerNorm(width, eps=1e-6)
        self.head = nn.Linear(width, classes)
        nn.init.trunc_normal_(self.cls_token, std=1e-6)

    def forward(self, x: Tensor) -> Tensor:
        x = self.patch_embed(x)
        x = torch.cat([self.cls_token.expand(len(x), -1, -1), x], dim=1) + self.pos_embed
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])
