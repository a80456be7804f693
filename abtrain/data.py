"""Data for training: a step-indexed sampler, and generated tensors for the built-in model.

The global batch of step t is a fixed slice of that epoch's permutation, and rank r takes
the r-th part of it. So the data a run sees depends only on (seed, step), which makes
resuming exact, and one process with batch world·b sees what `world` ranks see together.
"""

from __future__ import annotations

import torch
from torch import Tensor

from abtrain.config import Config


class StepSampler:
    def __init__(self, n: int, batch_size: int, rank: int, world_size: int, seed: int) -> None:
        self.global_batch = batch_size * world_size
        if self.global_batch > n:
            raise ValueError(
                f"batch_size·world_size = {self.global_batch} exceeds the {n} training samples"
            )
        self.n, self.batch_size, self.rank, self.seed = n, batch_size, rank, seed
        self.steps_per_epoch = n // self.global_batch

    def indices(self, step: int) -> Tensor:
        epoch, i = divmod(step, self.steps_per_epoch)
        g = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        perm = torch.randperm(self.n, generator=g)
        start = i * self.global_batch + self.rank * self.batch_size
        return perm[start : start + self.batch_size]


class SyntheticTask:
    """Classification of Gaussian inputs labelled by a fixed random teacher network."""

    def __init__(self, cfg: Config) -> None:
        d = cfg.data
        g = torch.Generator().manual_seed(cfg.seed + 7919)
        w1 = torch.randn(d.features, 4 * d.classes, generator=g)
        w2 = torch.randn(4 * d.classes, d.classes, generator=g)
        x = torch.randn(d.train_samples + d.val_samples, d.features, generator=g)
        y = (torch.tanh(x @ w1) @ w2).argmax(1)
        self.train = (x[: d.train_samples], y[: d.train_samples])
        self.val = (x[d.train_samples :], y[d.train_samples :])

    def train_batch(self, sampler: StepSampler, step: int) -> tuple[Tensor, Tensor]:
        idx = sampler.indices(step)
        return self.train[0][idx], self.train[1][idx]

    def val_shard(self, rank: int, world_size: int) -> tuple[Tensor, Tensor]:
        return self.val[0][rank::world_size], self.val[1][rank::world_size]
