"""Sources: where images come from, read and checked before anything is prepared.

CIFAR-10/100 (torchvision's checked download, or the original python-version archive or its
extracted folder), and ImageFolder trees (`train/<class>/*`, `val|test/<class>/*`) as a folder
or a .tar/.tar.gz archive (ImageNet comes this way).

An archive member with an absolute path, a `..` or a link refuses the whole archive; CIFAR
pickles load with an unpickler that can build numpy arrays and nothing else, so a crafted
batch file runs no code.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import torch
from torch import Tensor

from abtrain.config import ImageData

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".webp", ".tif", ".tiff"}
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


class DataError(ValueError):
    """Bad input data; the message names the path at fault."""


# ---------------------------------------------------------------- progress and checksums
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


# ---------------------------------------------------------------- CIFAR python batches
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


# ---------------------------------------------------------------- ImageFolder trees
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
            train, val = set(train_classes), set(self.splits["val"])
            lacking = [
                f"{split}/ has no {', '.join(sorted(missing))}"
                for split, missing in (("val (or test)", train - val), ("train", val - train))
                if missing
            ]
            raise DataError(
                f"{source}: train and val hold different class folders: {'; '.join(lacking)}"
            )
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
