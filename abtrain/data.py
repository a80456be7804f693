"""Data: where images come from, the prepare step, and the batches training reads.

Sources: CIFAR-10/100 (torchvision's checked download, or the original python-version
archive or its extracted folder), and ImageFolder trees (`train/<class>/*`, `val|test/<class>/*`)
as a folder or a .tar/.tar.gz archive (ImageNet comes this way).

`prepare` verifies a source (images per class, every selected image decodes, checksums where
known) and writes the folder training reads: small images as one uint8 tensor file per split,
so epochs never decode JPEGs again; large ones as an index of files. It writes into a
temporary folder and renames it into place, so a failure leaves nothing half-written.

The global batch of step t is a fixed slice of that epoch's permutation and rank r takes the
r-th part of it, so what a run sees depends only on (seed, step): resuming is exact, and one
process with batch world·b sees what `world` ranks see together. Augmentation draws from a
generator seeded by (seed, step, rank) for the same reason.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import shutil
import tarfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from PIL import Image, UnidentifiedImageError
from torch import Tensor

from abtrain.config import Config, ImageData

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".webp", ".tif", ".tiff"}
CACHE_MAX_SIZE = 64  # images this small (or smaller) are cached as tensors
CIFAR = {
    "cifar10": dict(
        archive="cifar-10-python.tar.gz",
        md5="c58f30108f718f92721af3b95e74349a",
        folder="cifar-10-batches-py",
        train=[f"data_batch_{i}" for i in range(1, 6)],
        val=["test_batch"],
        meta=("batches.meta", "label_names"),
        labels="labels",
    ),
    "cifar100": dict(
        archive="cifar-100-python.tar.gz",
        md5="eb9058c3a382ffc7106e4002c42a8d85",
        folder="cifar-100-python",
        train=["train"],
        val=["test"],
        meta=("meta", "fine_label_names"),
        labels="fine_labels",
    ),
}
IMAGENET_STATS = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


class DataError(ValueError):
    """Bad input data; the message names the path at fault."""


# ---------------------------------------------------------------- sampling
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

    def generator(self, step: int) -> torch.Generator:
        """The stream for this rank's augmentations at `step`."""
        return torch.Generator().manual_seed((self.seed * 1_000_003 + step) * 1009 + self.rank)


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

    def val_batches(self, rank: int, world: int, batch: int) -> Iterator[tuple[Tensor, Tensor]]:
        x, y = self.val[0][rank::world], self.val[1][rank::world]
        for i in range(0, len(y), batch):
            yield x[i : i + batch], y[i : i + batch]


# ---------------------------------------------------------------- sources
def _digest(path: Path, algorithm: str) -> str:
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _unpickle(blob: bytes, where: str) -> dict[str, Any]:
    try:
        return pickle.loads(blob, encoding="latin1")
    except Exception as err:
        raise DataError(f"{where}: not a CIFAR python batch ({err})") from None


def _cifar_files(d: ImageData) -> tuple[dict[str, bytes], str]:
    """The CIFAR batch files by name, read from an archive, a folder, or the download."""
    spec = CIFAR[d.name]
    names = spec["train"] + spec["val"] + [spec["meta"][0]]
    if d.source is None:
        from torchvision import datasets

        root = Path(d.prepared).parent / "downloads"
        cls = datasets.CIFAR10 if d.name == "cifar10" else datasets.CIFAR100
        cls(str(root), download=True)  # verifies the archive's md5
        source = root / spec["folder"]
    else:
        source = Path(d.source)
    if not source.exists():
        raise DataError(f"data.source {source} does not exist")
    if source.is_file():
        if source.name == spec["archive"] and _digest(source, "md5") != spec["md5"]:
            raise DataError(f"{source}: md5 does not match the published {d.name} archive")
        files = {}
        try:
            with tarfile.open(source) as tar:
                for m in tar:
                    if m.isfile() and Path(m.name).name in names:
                        files[Path(m.name).name] = tar.extractfile(m).read()
        except tarfile.TarError as err:
            raise DataError(f"{source}: not a readable tar archive ({err})") from None
    else:
        folder = source / spec["folder"] if (source / spec["folder"]).is_dir() else source
        files = {n: (folder / n).read_bytes() for n in names if (folder / n).is_file()}
    missing = [n for n in names if n not in files]
    if missing:
        raise DataError(f"{source}: missing CIFAR batch files {missing}")
    return files, str(source)


def _read_cifar(d: ImageData) -> tuple[dict[str, tuple[Tensor, Tensor]], list[str], str]:
    spec = CIFAR[d.name]
    files, source = _cifar_files(d)
    meta_name, key = spec["meta"]
    classes = list(_unpickle(files[meta_name], f"{source}:{meta_name}")[key])
    splits = {}
    for split in ("train", "val"):
        xs, ys = [], []
        for name in spec[split]:
            batch = _unpickle(files[name], f"{source}:{name}")
            try:
                x = torch.as_tensor(batch["data"], dtype=torch.uint8).view(-1, 3, 32, 32)
                y = torch.as_tensor(batch[spec["labels"]], dtype=torch.int64)
            except (KeyError, RuntimeError) as err:
                raise DataError(f"{source}:{name}: malformed CIFAR batch ({err})") from None
            xs.append(x)
            ys.append(y)
        splits[split] = (torch.cat(xs), torch.cat(ys))
    return splits, classes, source


class _Tree:
    """An ImageFolder tree, in a folder or an archive: {split: {class: [member]}}."""

    def __init__(self, source: Path) -> None:
        if not source.exists():
            raise DataError(f"data.source {source} does not exist")
        self.source = source
        self.archive = source.is_file()
        if self.archive:
            try:
                with tarfile.open(source) as tar:
                    entries = [(m.name, m.isdir()) for m in tar if m.isfile() or m.isdir()]
            except tarfile.TarError as err:
                raise DataError(f"{source}: not a readable tar archive ({err})") from None
        else:
            entries = [(str(p.relative_to(source)), p.is_dir()) for p in source.rglob("*")]
        self.splits: dict[str, dict[str, list[str]]] = {}
        for p, is_dir in sorted(entries):
            parts = Path(p).parts
            for i, part in enumerate(parts[:-1]):
                split = {"train": "train", "val": "val", "test": "val"}.get(part)
                if split and is_dir and len(parts) == i + 2:  # a class folder
                    self.splits.setdefault(split, {}).setdefault(parts[i + 1], [])
                elif split and not is_dir and len(parts) == i + 3:  # a file in one
                    self.splits.setdefault(split, {}).setdefault(parts[i + 1], []).append(p)
        if "train" not in self.splits or "val" not in self.splits:
            raise DataError(f"{source}: no train/<class>/ and val/<class>/ (or test/) folders")
        train_classes = sorted(self.splits["train"])
        if sorted(self.splits["val"]) != train_classes:
            raise DataError(f"{source}: train and val hold different class folders")
        for split, by_class in self.splits.items():
            for cls, files in by_class.items():
                if not any(Path(f).suffix.lower() in IMAGE_SUFFIXES for f in files):
                    raise DataError(f"{source}: class folder {split}/{cls} holds no images")
        self.classes = train_classes

    def read(self, members: list[str]) -> dict[str, bytes]:
        """The bytes of `members`, in one forward pass over an archive."""
        if not self.archive:
            return {m: (self.source / m).read_bytes() for m in members}
        wanted, out = set(members), {}
        with tarfile.open(self.source) as tar:
            for m in tar:
                if m.name in wanted:
                    out[m.name] = tar.extractfile(m).read()
        return out


def _decode(blob: bytes, where: str, size: int) -> Tensor:
    try:
        img = Image.open(io.BytesIO(blob)).convert("RGB")
    except (UnidentifiedImageError, OSError) as err:
        raise DataError(f"{where}: unreadable image ({err})") from None
    if img.size != (size, size):
        img = img.resize((size, size), Image.BILINEAR)
    return torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8).view(size, size, 3)


def _stratified(labels: Tensor, per_class: int) -> Tensor:
    """The first `per_class` samples of every class (all where per_class is 0)."""
    if per_class == 0:
        return torch.arange(len(labels))
    keep = [torch.nonzero(labels == c).flatten()[:per_class] for c in labels.unique()]
    return torch.cat(keep).sort().values


# ---------------------------------------------------------------- prepare
def fingerprint(d: ImageData) -> dict[str, Any]:
    return d.model_dump(mode="json", exclude={"workers", "augment"})


def prepare(d: ImageData) -> dict[str, Any]:
    """Verify the source and write `d.prepared`; skipped when it is already up to date."""
    out = Path(d.prepared)
    meta_path = out / "meta.json"
    if meta_path.exists() and json.loads(meta_path.read_text()).get("config") == fingerprint(d):
        return json.loads(meta_path.read_text())
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        meta = _prepare_into(d, tmp)
        meta["config"] = fingerprint(d)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return meta


def _prepare_into(d: ImageData, tmp: Path) -> dict[str, Any]:
    if d.source and d.sha256:
        source = Path(d.source)
        if not source.is_file():
            raise DataError(f"data.sha256 is set but data.source {source} is not a file")
        if _digest(source, "sha256") != d.sha256:
            raise DataError(f"{source}: sha256 does not match data.sha256")
    if d.name in CIFAR:
        splits, classes, source = _read_cifar(d)
        cached = True
    else:
        tree = _Tree(Path(d.source))
        classes, source = tree.classes, str(tree.source)
        cached = d.image_size <= CACHE_MAX_SIZE
    meta: dict[str, Any] = dict(name=d.name, source=source, classes=classes, cached=cached)
    counts = {}
    for split, per_class in (("train", d.train_per_class), ("val", d.val_per_class)):
        if d.name in CIFAR:
            x, y = splits[split]
            keep = _stratified(y, per_class)
            x, y = x[keep], y[keep]
            if d.image_size != 32:
                x = F.interpolate(x.float(), size=d.image_size, mode="bilinear").round().byte()
            torch.save(dict(x=x.contiguous(), y=y), tmp / f"{split}.pt")
        else:
            y, members = _select(tree, split, per_class)
            if cached:
                x = _decode_all(tree, members, d.image_size)
                torch.save(dict(x=x, y=y), tmp / f"{split}.pt")
            else:
                _verify_and_index(tree, members, y, tmp, split)
        counts[split] = {classes[c]: int((y == c).sum()) for c in range(len(classes))}
    meta["counts"] = counts
    if cached:
        x = torch.load(tmp / "train.pt", weights_only=True)["x"].float() / 255
        meta["mean"] = x.mean(dim=(0, 2, 3)).tolist()
        meta["std"] = x.std(dim=(0, 2, 3)).tolist()
    else:
        meta["mean"], meta["std"] = IMAGENET_STATS
    return meta


def _select(tree: _Tree, split: str, per_class: int) -> tuple[Tensor, list[str]]:
    members, labels = [], []
    for c, cls in enumerate(tree.classes):
        files = [f for f in tree.splits[split][cls] if Path(f).suffix.lower() in IMAGE_SUFFIXES]
        files = files[:per_class] if per_class else files
        members += files
        labels += [c] * len(files)
    return torch.tensor(labels), members


def _decode_all(tree: _Tree, members: list[str], size: int) -> Tensor:
    blobs = tree.read(members)
    x = torch.empty(len(members), 3, size, size, dtype=torch.uint8)
    for i, m in enumerate(members):
        x[i] = _decode(blobs[m], f"{tree.source}:{m}", size).permute(2, 0, 1)
    return x


def _verify_and_index(tree: _Tree, members: list[str], y: Tensor, tmp: Path, split: str) -> None:
    """Large images stay files (copied out of an archive); every one must decode."""
    files = []
    for m, blob in tree.read(members).items():
        where = f"{tree.source}:{m}"
        try:
            Image.open(io.BytesIO(blob)).verify()
        except (UnidentifiedImageError, OSError) as err:
            raise DataError(f"{where}: unreadable image ({err})") from None
        if tree.archive:
            dest = tmp / "files" / m
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(blob)
            files.append(str(Path("files") / m))
        else:
            files.append(str((tree.source / m).resolve()))
    order = {m: i for i, m in enumerate(members)}
    index = sorted(zip(files, y.tolist(), members), key=lambda t: order[t[2]])
    (tmp / f"{split}.index.json").write_text(json.dumps([[f, label] for f, label, _ in index]))


# ---------------------------------------------------------------- training input
def _augment(x: Tensor, g: torch.Generator) -> Tensor:
    """CIFAR-style: zero-pad 4, random crop back to size, random horizontal flip."""
    n, _, h, w = x.shape
    padded = F.pad(x, (4, 4, 4, 4))
    dy = torch.randint(0, 9, (n,), generator=g)
    dx = torch.randint(0, 9, (n,), generator=g)
    flip = torch.rand(n, generator=g) < 0.5
    out = torch.empty_like(x)
    for i in range(n):
        crop = padded[i, :, dy[i] : dy[i] + h, dx[i] : dx[i] + w]
        out[i] = crop.flip(-1) if flip[i] else crop
    return out


class ImageTask:
    """Training and validation batches from a prepared folder."""

    def __init__(self, cfg: Config) -> None:
        d = cfg.data
        self.root = Path(d.prepared)
        meta_path = self.root / "meta.json"
        if not meta_path.exists():
            raise DataError(
                f"{self.root} is not prepared: run `python -m abtrain prepare --config ...` first"
            )
        self.meta = json.loads(meta_path.read_text())
        if self.meta.get("config") != fingerprint(d):
            raise DataError(f"{self.root} was prepared from another data config: prepare again")
        self.classes, self.features = len(self.meta["classes"]), 0
        self.size, self.augment, self.workers = d.image_size, d.augment, d.workers
        self.mean = torch.tensor(self.meta["mean"]).view(1, 3, 1, 1)
        self.std = torch.tensor(self.meta["std"]).view(1, 3, 1, 1)
        if self.meta["cached"]:
            self.train = torch.load(self.root / "train.pt", weights_only=True)
            self.val = torch.load(self.root / "val.pt", weights_only=True)
        else:
            self.train = json.loads((self.root / "train.index.json").read_text())
            self.val = json.loads((self.root / "val.index.json").read_text())
            # decoding threads: PIL releases the GIL while it decodes
            self._pool = ThreadPoolExecutor(max(1, d.workers))

    def __len__(self) -> int:
        return len(self.train["y"]) if self.meta["cached"] else len(self.train)

    def _normalize(self, x: Tensor) -> Tensor:
        return (x.float() / 255 - self.mean) / self.std

    def train_batch(self, sampler: StepSampler, step: int) -> tuple[Tensor, Tensor]:
        idx, g = sampler.indices(step), sampler.generator(step)
        if self.meta["cached"]:
            x, y = self.train["x"][idx], self.train["y"][idx]
            return self._normalize(_augment(x, g) if self.augment else x), y
        seed = g.initial_seed()
        files = [self.train[i][0] for i in idx.tolist()]
        gens = [torch.Generator().manual_seed(seed * 4099 + j) for j in range(len(files))]
        x = torch.stack(list(self._pool.map(self._load, files, gens)))
        y = torch.tensor([self.train[i][1] for i in idx.tolist()])
        return self._normalize(x), y

    def val_batches(self, rank: int, world: int, batch: int) -> Iterator[tuple[Tensor, Tensor]]:
        if self.meta["cached"]:
            x, y = self.val["x"][rank::world], self.val["y"][rank::world]
            for i in range(0, len(y), batch):
                yield self._normalize(x[i : i + batch]), y[i : i + batch]
            return
        shard = self.val[rank::world]
        for i in range(0, len(shard), batch):
            part = shard[i : i + batch]
            x = torch.stack(list(self._pool.map(self._load, [f for f, _ in part])))
            yield self._normalize(x), torch.tensor([label for _, label in part])

    def _load(self, file: str, g: torch.Generator | None = None) -> Tensor:
        """ImageNet-style: RandomResizedCrop + flip for training, resize + centre crop else."""
        from torchvision.transforms.v2 import functional as TF

        path = self.root / file if not os.path.isabs(file) else Path(file)
        img = TF.pil_to_tensor(Image.open(path).convert("RGB"))
        if g is None or not self.augment:
            img = TF.resize(img, [round(self.size * 256 / 224)], antialias=True)
            return TF.center_crop(img, [self.size])
        h, w = img.shape[-2:]
        for _ in range(10):
            area = h * w * (0.08 + 0.92 * torch.rand(1, generator=g).item())
            ratio = torch.exp(torch.empty(1).uniform_(-0.2877, 0.2877, generator=g)).item()
            ch, cw = round((area / ratio) ** 0.5), round((area * ratio) ** 0.5)
            if 0 < ch <= h and 0 < cw <= w:
                top = torch.randint(0, h - ch + 1, (1,), generator=g).item()
                left = torch.randint(0, w - cw + 1, (1,), generator=g).item()
                break
        else:
            ch, cw, top, left = h, w, 0, 0
        img = TF.resized_crop(img, top, left, ch, cw, [self.size, self.size], antialias=True)
        return TF.horizontal_flip(img) if torch.rand(1, generator=g).item() < 0.5 else img


def make_task(cfg: Config) -> SyntheticTask | ImageTask:
    return SyntheticTask(cfg) if cfg.data.name == "synthetic" else ImageTask(cfg)
