"""Data: where images come from, the prepare step, and the batches training reads.

Sources: CIFAR-10/100 (torchvision's checked download, or the original python-version
archive or its extracted folder), and ImageFolder trees (`train/<class>/*`, `val|test/<class>/*`)
as a folder or a .tar/.tar.gz archive (ImageNet comes this way).

`prepare` verifies a source (images per class, every selected image decodes, checksums where
known) and writes the folder training reads: small images as one uint8 tensor file per split,
so epochs never decode JPEGs again; large ones as an index of files. It writes into a
temporary folder and renames it into place, so a failure leaves nothing half-written. It
replaces only a folder it prepared itself; an archive member with an absolute path, a `..`
or a link refuses the whole archive; CIFAR pickles load with an unpickler that can build
numpy arrays and nothing else, so a crafted batch file runs no code.

The global batch of step t is a fixed slice of that epoch's permutation and rank r takes the
r-th part of it, so what a run sees depends only on (seed, step): resuming is exact, and one
process with batch world·b sees what `world` ranks see together. Augmentation draws from
generators seeded by (seed, step, position in the global batch) for the same reason, so the
ranks' augmented images together are also exactly the one process's.

Images read from files are decoded and augmented ahead of the training step, in DataLoader
worker processes (`train_batches`); which worker builds a batch changes nothing.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import math
import os
import pickle
import re
import shutil
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, UnidentifiedImageError
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, get_worker_info

from abtrain.config import Config, ImageData, SyntheticData

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
CROP_SCALE = (0.08, 1.0)  # RandomResizedCrop's defaults, as the paper uses them
CROP_RATIO = (3 / 4, 4 / 3)
# as torchvision computes it (float32), so the drawn ratios are bit-identical to its own
_LOG_RATIO = tuple(torch.log(torch.tensor(CROP_RATIO)).tolist())
PREFETCH = 2  # batches each worker builds ahead


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

    @property
    def offset(self) -> int:
        """Where this rank's part starts in the global batch."""
        return self.rank * self.batch_size

    def generator(self, step: int) -> torch.Generator:
        """The stream for the augmentations of `step`'s whole global batch.

        The same on every rank: each draws for all global_batch images and uses its own
        part, so the ranks together augment exactly as one process with the whole batch.
        """
        return torch.Generator().manual_seed((self.seed * 1_000_003 + step) % (1 << 64))

    def image_generator(self, step: int, j: int) -> torch.Generator:
        """The stream for image j of this rank's part of `step`'s batch.

        An image read from a file draws a varying number of values (the crop's retries), so
        each gets its own stream, keyed by its position in the global batch.
        """
        key = (self.seed * 1_000_003 + step) * 1_000_003 + self.offset + j
        return torch.Generator().manual_seed(key % (1 << 64))


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


# ---------------------------------------------------------------- sources
PROGRESS_EVERY_S = 5.0  # prepare's progress lines: at most one per this many seconds


class _Progress:
    """`[prepare] WHAT: 120 of 400 MB (30%), 85 MB/s, ETA 3 s` on stderr, at most once every
    PROGRESS_EVERY_S seconds and once at the end: a line per image or per chunk would cost
    more than the work on a fast disk, and flood a log."""

    def __init__(self, what: str, total: float, unit: str, scale: float = 1.0) -> None:
        self.what, self.total, self.unit, self.scale = what, total, unit, scale
        self.t0 = self.last = time.monotonic()

    def update(self, done: float) -> None:
        now = time.monotonic()
        if now - self.last >= PROGRESS_EVERY_S or done >= self.total:
            self.last = now
            self._line(done, now - self.t0)

    def _line(self, done: float, seconds: float) -> None:
        d, t = done / self.scale, self.total / self.scale
        rate = d / seconds if seconds > 0 else 0.0
        share = f" ({100 * done / self.total:.0f}%)" if self.total else ""
        eta = f", ETA {(t - d) / rate:.0f} s" if rate and d < t else f", {seconds:.1f} s"
        print(
            f"[prepare] {self.what}: {d:,.0f} of {t:,.0f} {self.unit}{share}, "
            f"{rate:,.0f} {self.unit}/s{eta}",
            file=sys.stderr,
            flush=True,
        )


def _digest(path: Path, algorithm: str) -> str:
    """The file's digest, read in 4 MiB chunks so that progress can be told (hashlib lets go
    of the GIL on large updates: as fast as hashlib.file_digest)."""
    h = hashlib.new(algorithm)
    progress = _Progress(f"{algorithm} of {path}", path.stat().st_size, "MB", 1e6)
    done = 0
    with open(path, "rb") as f:
        while chunk := f.read(4 << 20):
            h.update(chunk)
            done += len(chunk)
            progress.update(done)
    return h.hexdigest()


class _RefusedGlobal(pickle.UnpicklingError):
    pass


class _CifarUnpickler(pickle.Unpickler):
    """Unpickles what a CIFAR python batch holds and nothing else.

    A pickle can call any importable function while it loads, so a crafted batch file runs
    code. The batches are dicts of str, bytes, int lists and numpy arrays; only the three
    globals a numpy array's pickle names may be looked up (numpy 2 moved `numpy.core` to
    `numpy._core` and writes that name).
    """

    ALLOWED = frozenset(
        {
            ("numpy.core.multiarray", "_reconstruct"),
            ("numpy._core.multiarray", "_reconstruct"),
            ("numpy", "ndarray"),
            ("numpy", "dtype"),
        }
    )

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self.ALLOWED:
            raise _RefusedGlobal(f"{module}.{name}")
        return super().find_class(module, name)


def _unpickle(blob: bytes, where: str) -> dict[str, Any]:
    try:
        # latin1: the original batches were pickled by Python 2, whose str holds the pixels
        obj = _CifarUnpickler(io.BytesIO(blob), encoding="latin1").load()
    except _RefusedGlobal as err:
        raise DataError(
            f"{where}: refused to unpickle: it calls {err}, which a CIFAR python batch never "
            "does (a crafted or foreign file; nothing of it was run)"
        ) from None
    except Exception as err:
        raise DataError(f"{where}: not a CIFAR python batch ({err})") from None
    if not isinstance(obj, dict):
        raise DataError(f"{where}: not a CIFAR python batch (holds a {type(obj).__name__})")
    # a batch re-pickled by Python 3 after loading with encoding="bytes" has bytes keys
    return {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in obj.items()}


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


def _check_member(source: Path, m: tarfile.TarInfo) -> None:
    """Refuse an archive member that could land outside the prepared folder.

    tarfile's "data" extraction filter's rules, made stricter: it strips a leading "/" and
    allows links that stay inside; a data set needs neither, so any of them means the
    archive is not what it claims and the whole archive is refused, not the member skipped.
    """
    name = m.name
    if name.startswith("/") or os.path.isabs(name):
        why = "an absolute path"
    elif ".." in PurePosixPath(name).parts:
        why = "a '..' component"
    elif m.issym() or m.islnk():
        why = f"a link (to {m.linkname!r})"
    elif not (m.isfile() or m.isdir()):
        why = "a special file (device, pipe)"
    else:
        return
    raise DataError(
        f"{source}: archive member {name!r} has {why}; refusing the archive (nothing was extracted)"
    )


class _Tree:
    """An ImageFolder tree, in a folder or an archive: {split: {class: [member]}}."""

    def __init__(self, source: Path) -> None:
        if not source.exists():
            raise DataError(f"data.source {source} does not exist")
        self.source = source
        self.archive = source.is_file()
        if self.archive:
            entries = {}
            try:
                with tarfile.open(source) as tar:
                    for m in tar:
                        _check_member(source, m)
                        entries[m.name] = m.isdir()  # a name written twice: the last wins
            except tarfile.TarError as err:
                raise DataError(f"{source}: not a readable tar archive ({err})") from None
        else:
            entries = {str(p.relative_to(source)): p.is_dir() for p in source.rglob("*")}
        self.splits: dict[str, dict[str, list[str]]] = {}
        for p, is_dir in sorted(entries.items()):
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

    def blobs(self, members: list[str]) -> Iterator[tuple[str, bytes]]:
        """(member, bytes) of each of `members`, one at a time (a split of ImageNet does not
        fit in memory). An archive gives them in its own order, in one forward pass."""
        if not self.archive:
            for m in members:
                yield m, (self.source / m).read_bytes()
            return
        wanted = set(members)
        with tarfile.open(self.source) as tar:
            for m in tar:
                if m.name in wanted and m.isfile():
                    yield m.name, tar.extractfile(m).read()


# what PIL raises on a file that is not a whole image: a truncated PNG fails its checksum
# with SyntaxError, a pixel count past PIL's bomb guard with DecompressionBombError
_BAD_IMAGE = (
    UnidentifiedImageError,
    OSError,
    SyntaxError,
    ValueError,
    Image.DecompressionBombError,
)


def _decode(blob: bytes, where: str, size: int) -> Tensor:
    try:
        img = Image.open(io.BytesIO(blob)).convert("RGB")
    except _BAD_IMAGE as err:
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


PREPARED_BY = "abtrain prepare"  # meta.json's mark of a folder this code wrote
# what meta.json held before it carried the mark: such folders are abtrain's too
_LEGACY_META = frozenset({"name", "source", "classes", "cached", "counts", "config"})
REPO = Path(__file__).resolve().parents[1]


def _prepared_meta(folder: Path) -> dict[str, Any] | None:
    """meta.json of a folder that abtrain prepared; None for any other folder."""
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict):
        return None
    if meta.get("prepared_by") == PREPARED_BY or _LEGACY_META <= meta.keys():
        return meta
    return None


def _prepared_folder(d: ImageData) -> Path:
    """`d.prepared`, resolved, once it is sure that replacing it destroys nothing else.

    Preparing replaces the whole folder, so it must be one of abtrain's own: not a user's
    folder, and not one holding the source, the working directory or this repository.
    """
    out = Path(d.prepared).resolve()
    what = f"data.prepared {d.prepared!r} ({out})"
    if Path.cwd().resolve().is_relative_to(out):
        raise DataError(f"{what} is the working directory or a folder above it")
    if REPO.is_relative_to(out):
        raise DataError(f"{what} holds the abtrain repository")
    if d.source is not None:
        source = Path(d.source).resolve()
        if source.is_relative_to(out):
            raise DataError(f"{what} holds data.source {d.source!r}")
    if out.exists() and _prepared_meta(out) is None:
        raise DataError(
            f"{what} exists and is not a folder abtrain prepared (no abtrain meta.json); "
            "preparing replaces the whole folder, so point data.prepared at a new folder "
            "or remove this one yourself"
        )
    return out


def prepare(d: ImageData) -> dict[str, Any]:
    """Verify the source and write `d.prepared`; skipped when it is already up to date."""
    out = _prepared_folder(d)
    meta = _prepared_meta(out)
    if meta is not None and meta.get("config") == fingerprint(d):
        return meta
    _clear_leftovers(out)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        meta = _prepare_into(d, tmp)
        meta["config"] = fingerprint(d)
        meta["prepared_by"] = PREPARED_BY
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
        _replace(out, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return meta


def _clear_leftovers(out: Path) -> None:
    """The temporary folders of a prepare that was killed (`.NAME.tmpPID`, `.NAME.oldPID`):
    removed once no process has that pid. A live one may be another prepare at work."""
    for folder in out.parent.glob(f".{out.name}.*"):
        m = re.fullmatch(rf"\.{re.escape(out.name)}\.(?:tmp|old)(\d+)", folder.name)
        if m is None or not folder.is_dir():
            continue
        try:
            os.kill(int(m.group(1)), 0)
        except ProcessLookupError:
            print(f"[prepare] removing {folder}: left by a prepare that was stopped", flush=True)
            shutil.rmtree(folder, ignore_errors=True)
        except PermissionError:
            pass  # another user's live process


def _replace(out: Path, new: Path) -> None:
    """Put `new` in the place of `out`; at every moment one of the two is there whole."""
    if not out.exists():
        os.replace(new, out)
        return
    old = out.with_name(f".{out.name}.old{os.getpid()}")
    shutil.rmtree(old, ignore_errors=True)
    os.replace(out, old)
    try:
        os.replace(new, out)
    except BaseException:
        os.replace(old, out)
        raise
    shutil.rmtree(old)


def train_size(d: SyntheticData | ImageData) -> tuple[int | None, str]:
    """How many training samples a run on `d` draws from, and where that number comes from.

    Without a prepared folder an ImageFolder tree's size is unknown (None): counting it
    means reading the whole source.
    """
    if isinstance(d, SyntheticData):
        return d.train_samples, "data.train_samples"
    meta = _prepared_meta(Path(d.prepared))
    if meta is not None and meta.get("config") == fingerprint(d):
        return sum(meta["counts"]["train"].values()), f"{Path(d.prepared) / 'meta.json'}"
    if d.name in CIFAR:
        classes, per_class = (10, 5000) if d.name == "cifar10" else (100, 500)
        if d.train_per_class:
            per_class = min(per_class, d.train_per_class)
        return classes * per_class, f"{d.name} with data.train_per_class={d.train_per_class}"
    return None, f"{d.prepared} is not prepared"


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
                x = _decode_all(tree, members, d.image_size, split)
                torch.save(dict(x=x, y=y), tmp / f"{split}.pt")
            else:
                _verify_and_index(tree, members, y, tmp, split, d.image_size)
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


def _decode_all(tree: _Tree, members: list[str], size: int, split: str) -> Tensor:
    row = {m: i for i, m in enumerate(members)}
    x = torch.empty(len(members), 3, size, size, dtype=torch.uint8)
    seen = set()
    progress = _Progress(f"decoding {split}", len(members), "images")
    for m, blob in tree.blobs(members):
        x[row[m]] = _decode(blob, f"{tree.source}:{m}", size).permute(2, 0, 1)
        seen.add(m)
        progress.update(len(seen))
    _all_read(tree, members, seen)
    return x


def _all_read(tree: _Tree, members: list[str], seen: set[str] | dict[str, Any]) -> None:
    missing = [m for m in members if m not in seen]
    if missing:
        raise DataError(f"{tree.source}: members {missing[:3]} could not be read")


def _verify_and_index(
    tree: _Tree, members: list[str], y: Tensor, tmp: Path, split: str, size: int
) -> None:
    """Large images stay files (copied out of an archive); every one must decode.

    An archive gives its members in its own order (GNU tar's is the directory's, not
    sorted), so a file's label is looked up by its name, never taken by position.
    """
    label = dict(zip(members, y.tolist()))
    files_dir = tmp / "files"
    path = {}
    progress = _Progress(f"verifying {split}", len(members), "images")
    for m, blob in tree.blobs(members):
        progress.update(len(path))
        where = f"{tree.source}:{m}"
        try:  # decoded, not only verify()'d: that reads a JPEG's header, not its data
            with Image.open(io.BytesIO(blob)) as img:
                img.draft("RGB", (size, size))  # a JPEG decodes scaled down, every byte read
                img.load()
        except _BAD_IMAGE as err:
            raise DataError(f"{where}: unreadable image ({err})") from None
        if tree.archive:
            dest = files_dir / m
            # _check_member refused every name that leaves the folder; this holds the line
            # should that ever change
            if not dest.resolve().is_relative_to(files_dir.resolve()):
                raise DataError(f"{where}: the member would be written outside {tmp}")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(blob)
            path[m] = str(dest.relative_to(tmp))
        else:
            path[m] = str((tree.source / m).resolve())
    progress.update(len(path))
    _all_read(tree, members, path)
    index = [[path[m], label[m]] for m in members]
    (tmp / f"{split}.index.json").write_text(json.dumps(index))


# ---------------------------------------------------------------- training input
def _augment(x: Tensor, g: torch.Generator, offset: int = 0, total: int | None = None) -> Tensor:
    """CIFAR-style: zero-pad 4, random crop back to size, random horizontal flip.

    `g` draws for all `total` images of the global batch and `x` gets rows offset.., so a
    rank's part is augmented as it would be inside the whole batch.
    """
    n, _, h, w = x.shape
    total = n if total is None else total
    padded = F.pad(x, (4, 4, 4, 4))
    part = slice(offset, offset + n)
    dy = torch.randint(0, 9, (total,), generator=g)[part]
    dx = torch.randint(0, 9, (total,), generator=g)[part]
    flip = (torch.rand(total, generator=g) < 0.5)[part]
    out = torch.empty_like(x)
    for i in range(n):
        crop = padded[i, :, dy[i] : dy[i] + h, dx[i] : dx[i] + w]
        out[i] = crop.flip(-1) if flip[i] else crop
    return out


def crop_params(height: int, width: int, g: torch.Generator) -> tuple[int, int, int, int]:
    """RandomResizedCrop's box (top, left, height, width), drawn from `g`.

    torchvision's RandomResizedCrop draws from the global RNG, which DataLoader seeds per
    worker, so the crop would depend on which worker decoded the batch. This draws the same
    sequence (the same calls, scale 0.08-1, ratio 3/4-4/3, 10 tries, then its centre-crop
    fallback) from the (seed, step, image) stream instead: the same distribution, and the
    same box torchvision gives when the global RNG holds g's state.
    """
    area = height * width
    for _ in range(10):
        target = area * torch.empty(1).uniform_(*CROP_SCALE, generator=g).item()
        aspect = torch.exp(torch.empty(1).uniform_(*_LOG_RATIO, generator=g)).item()
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, size=(1,), generator=g).item())
            left = int(torch.randint(0, width - w + 1, size=(1,), generator=g).item())
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < min(CROP_RATIO):
        w, h = width, int(round(width / min(CROP_RATIO)))
    elif in_ratio > max(CROP_RATIO):
        w, h = int(round(height * max(CROP_RATIO))), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def _draft(img: Image.Image, fx: float, fy: float) -> int:
    """Let libjpeg decode a JPEG at 1/2, 1/4 or 1/8 scale; returns the scale's divisor.

    `fx`, `fy` are how much the transform shrinks the image anyway; the request keeps the
    part that is used at least as large as the output, so the transform still shrinks (or
    keeps) it afterwards and no detail the output could hold is lost; only the filter of
    the first reduction differs (DCT scaling instead of bilinear). Other formats: 1.
    """
    width = img.width
    drafted = img.draft("RGB", (math.ceil(width * fx), math.ceil(img.height * fy)))
    return 1 if drafted is None else round(width / drafted[1][2])


def _load(path: str, size: int, g: torch.Generator | None) -> Tensor:
    """One image as uint8 (3, size, size): RandomResizedCrop + flip drawn from `g`, or (g
    None) resize to size·256/224 and centre crop, as the paper's ImageNet pipeline."""
    from torchvision.transforms.v2 import functional as TF

    try:
        with Image.open(path) as src:
            width, height = src.size
            if g is None:
                short = round(size * 256 / 224)
                f = short / min(width, height)
                _draft(src, f, f)
                img = src if src.mode == "RGB" else src.convert("RGB")
                img = TF.center_crop(TF.resize(img, [short]), [size])
            else:
                top, left, h, w = crop_params(height, width, g)
                k = _draft(src, size / w, size / h)
                img = src if src.mode == "RGB" else src.convert("RGB")
                if k == 1:
                    img = TF.resized_crop(img, top, left, h, w, [size, size])
                else:  # in the reduced image the box is fractional, which only PIL takes
                    box = (left / k, top / k, (left + w) / k, (top + h) / k)
                    img = img.resize((size, size), Image.BILINEAR, box=box)
                if torch.rand(1, generator=g).item() < 0.5:
                    img = TF.horizontal_flip(img)
            return TF.pil_to_tensor(img)  # inside: `img` may still be the lazily read `src`
    except (UnidentifiedImageError, OSError) as err:
        raise DataError(f"{path}: unreadable image ({err})") from None


def _read_index(path: Path) -> dict[str, Any]:
    """A split's files and labels. The paths are one numpy bytes array, not a list of str:
    forked workers touching the refcounts of a million small objects would each copy them."""
    entries = json.loads(path.read_text())
    return dict(
        files=np.array([os.fsencode(f) for f, _ in entries], dtype=np.bytes_),
        y=torch.tensor([label for _, label in entries], dtype=torch.int64),
    )


def _init_worker(worker_id: int) -> None:
    # a worker decodes one image at a time; torch's intra-op threads would only compete
    # with the other workers and the training step for the cores
    torch.set_num_threads(1)


class _Items(Dataset):
    """Item k is fn(k), one whole batch; DataLoader builds items in its worker processes."""

    def __init__(self, fn: Callable[[int], tuple[Tensor, Tensor]], n: int) -> None:
        self.fn, self.n = fn, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, k: int) -> tuple[Tensor, Tensor]:
        return self.fn(k)


def _ahead(
    fn: Callable[[int], tuple[Tensor, Tensor]], n: int, workers: int
) -> Iterator[tuple[Tensor, Tensor]]:
    """fn(0), ..., fn(n-1) in order, built ahead by `workers` processes (0: in-process)."""
    if workers == 0 or n == 0:
        for k in range(n):
            yield fn(k)
        return
    loader = DataLoader(
        _Items(fn, n),
        batch_size=None,  # an item is already a batch
        num_workers=min(workers, n),
        pin_memory=torch.cuda.is_available(),
        prefetch_factor=PREFETCH,
        persistent_workers=True,
        worker_init_fn=_init_worker,
    )
    for batch in loader:  # DataLoader turns the (x, y) tuple into a list
        yield tuple(batch)
    # closing this generator early drops the loader and its iterator, which stops the workers


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
            self.train = _read_index(self.root / "train.index.json")
            self.val = _read_index(self.root / "val.index.json")

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
