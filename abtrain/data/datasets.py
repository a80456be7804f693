"""Tasks: the batches training reads, from generated data or a prepared folder.

`make_task` picks one by data.name; a task gives this rank's batch of each step
(`train_batch`), the same batches built ahead for a range of steps (`train_batches`), and
this rank's shard of the validation set (`val_batches`).
"""

from __future__ import annotations

import functools
import io
import json
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import get_worker_info

from abtrain.config import Config
from abtrain.data.loader import StepSampler, _ahead, _augment, _load
from abtrain.data.prepare import PREPARE_AGAIN, file_problem, problem
from abtrain.data.sources import DataError


# ---------------------------------------------------------------- generated data
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
        self.classes, self.features = d.classes, d.features

    def __len__(self) -> int:
        return len(self.train[1])

    def train_batch(self, sampler: StepSampler, step: int) -> tuple[Tensor, Tensor]:
        idx = sampler.indices(step)
        return self.train[0][idx], self.train[1][idx]

    def train_batches(
        self, sampler: StepSampler, start_step: int, stop_step: int
    ) -> Iterator[tuple[Tensor, Tensor]]:
        """`train_batch` for each step in [start_step, stop_step); cheap, so in-process."""
        for step in range(start_step, stop_step):
            yield self.train_batch(sampler, step)

    def val_batches(self, rank: int, world: int, batch: int) -> Iterator[tuple[Tensor, Tensor]]:
        x, y = self.val[0][rank::world], self.val[1][rank::world]
        for i in range(0, len(y), batch):
            yield x[i : i + batch], y[i : i + batch]


# ---------------------------------------------------------------- prepared folders
def _read_index(entries: list) -> dict[str, Any]:
    """A split's files and labels. The paths are one numpy bytes array, not a list of str:
    forked workers touching the refcounts of a million small objects would each copy them."""
    return dict(
        files=np.array([os.fsencode(e[0]) for e in entries], dtype=np.bytes_),
        y=torch.tensor([e[1] for e in entries], dtype=torch.int64),
    )


def unprepared(d: Any) -> str | None:
    """Why the data config's prepared folder can't be trained from (None: it can), damage
    since it was prepared included; the launcher asks before any rank starts."""
    return problem(d)


def _read_checked(path: Path, record: dict[str, Any]) -> bytes:
    """A split file's bytes, read once and checked against what prepare recorded."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        data = None
    why = file_problem(path, record, data) if data is not None else f"{path} is missing"
    if why:
        raise DataError(f"{why}: {PREPARE_AGAIN}")
    return data


class ImageTask:
    """Training and validation batches from a prepared folder."""

    def __init__(self, cfg: Config) -> None:
        d = cfg.data
        self.root = Path(d.prepared)
        if (why := unprepared(d)) is not None:
            raise DataError(why)
        self.meta = json.loads((self.root / "meta.json").read_text())
        self.classes, self.features = len(self.meta["classes"]), 0
        self.size, self.augment, self.workers = d.image_size, d.augment, d.workers
        self.mean = torch.tensor(self.meta["mean"]).view(1, 3, 1, 1)
        self.std = torch.tensor(self.meta["std"]).view(1, 3, 1, 1)
        files = self.meta["files"]  # each split file is checked as it is read
        if self.meta["cached"]:
            self.train, self.val = (
                torch.load(io.BytesIO(_read_checked(self.root / f, files[f])), weights_only=True)
                for f in ("train.pt", "val.pt")
            )
        else:
            self.train, self.val = (
                _read_index(json.loads(_read_checked(self.root / f, files[f])))
                for f in ("train.index.json", "val.index.json")
            )

    def __len__(self) -> int:
        return len(self.train["y"])

    def _normalize(self, x: Tensor) -> Tensor:
        return (x.float() / 255 - self.mean) / self.std

    def train_batch(self, sampler: StepSampler, step: int) -> tuple[Tensor, Tensor]:
        """This rank's batch of `step`: the one definition `train_batches` also builds."""
        idx = sampler.indices(step)
        if self.meta["cached"]:
            x, y = self.train["x"][idx], self.train["y"][idx]
            if self.augment:
                x = _augment(x, sampler.generator(step), sampler.offset, sampler.global_batch)
            return self._normalize(x), y
        gens = [sampler.image_generator(step, j) for j in range(len(idx))]
        return self._decode(self.train, idx, gens if self.augment else None)

    def train_batches(
        self, sampler: StepSampler, start_step: int, stop_step: int
    ) -> Iterator[tuple[Tensor, Tensor]]:
        """`train_batch` of each step in [start_step, stop_step), in order.

        Images read from files are decoded in `data.workers` processes running ahead of the
        consumer; cached tensors are cheap to slice, so those stay in-process.
        """
        n = max(0, stop_step - start_step)
        if self.meta["cached"]:
            for step in range(start_step, start_step + n):
                yield self.train_batch(sampler, step)
            return
        batch = functools.partial(_shifted, self.train_batch, sampler, start_step)
        yield from _ahead(batch, n, self.workers)

    def val_batches(self, rank: int, world: int, batch: int) -> Iterator[tuple[Tensor, Tensor]]:
        if self.meta["cached"]:
            x, y = self.val["x"][rank::world], self.val["y"][rank::world]
            for i in range(0, len(y), batch):
                yield self._normalize(x[i : i + batch]), y[i : i + batch]
            return
        shard = torch.arange(rank, len(self.val["y"]), world)
        n = math.ceil(len(shard) / batch)
        part = functools.partial(_val_part, self, shard, batch)
        yield from _ahead(part, n, self.workers)

    def _decode(
        self, split: dict[str, Any], idx: Tensor, gens: list[torch.Generator] | None
    ) -> tuple[Tensor, Tensor]:
        x = torch.empty(len(idx), 3, self.size, self.size)
        if get_worker_info() is not None:
            # written straight into shared memory, the batch reaches the training process
            # without another copy (as DataLoader's own collate does)
            x.share_memory_()
        mean, std = self.mean.view(3, 1, 1), self.std.view(3, 1, 1)
        for j, i in enumerate(idx.tolist()):
            path = os.path.join(self.root, os.fsdecode(split["files"][i]))
            img = _load(path, self.size, None if gens is None else gens[j])
            # normalised image by image, in place: while it is in cache, which the same
            # arithmetic over the whole batch at once is not (several times slower)
            torch.div(img, 255, out=x[j]).sub_(mean).div_(std)
        return x, split["y"][idx]


def _shifted(
    fn: Callable[[StepSampler, int], tuple[Tensor, Tensor]],
    sampler: StepSampler,
    start: int,
    k: int,
) -> tuple[Tensor, Tensor]:
    return fn(sampler, start + k)


def _val_part(task: ImageTask, shard: Tensor, batch: int, i: int) -> tuple[Tensor, Tensor]:
    return task._decode(task.val, shard[i * batch : (i + 1) * batch], None)


def make_task(cfg: Config) -> SyntheticTask | ImageTask:
    return SyntheticTask(cfg) if cfg.data.name == "synthetic" else ImageTask(cfg)
