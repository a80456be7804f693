"""The prepare step: a checked source becomes the folder training reads.

`prepare` verifies a source (images per class, every selected image decodes, checksums where
known) and writes the folder training reads: small images as one uint8 tensor file per split,
so epochs never decode JPEGs again; large ones as an index of files. It writes into a
temporary folder and renames it into place, so a failure leaves nothing half-written. It
replaces only a folder it prepared itself.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from PIL import Image, UnidentifiedImageError
from torch import Tensor

from abtrain.config import ImageData, SyntheticData
from abtrain.data.sources import (
    CIFAR,
    IMAGE_SUFFIXES,
    DataError,
    _digest,
    _Progress,
    _read_cifar,
    _Tree,
)

CACHE_MAX_SIZE = 64  # images this small (or smaller) are cached as tensors
IMAGENET_STATS = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


# ---------------------------------------------------------------- decoding checks
# what PIL raises on a file that is not a whole image: a truncated PNG fails its checksum
# with SyntaxError, a pixel count past PIL's bomb guard with DecompressionBombError
_BAD_IMAGE = (
    UnidentifiedImageError,
    OSError,
    SyntaxError,
    ValueError,
    Image.DecompressionBombError,
)


def unreadable(where: str, blob: bytes, err: Exception) -> DataError:
    """A file that is no whole image, named with what it holds (PIL's own message names
    the in-memory buffer it read, `<_io.BytesIO object at 0x...>`)."""
    if not blob:
        return DataError(f"{where}: unreadable image (an empty file, 0 bytes)")
    why = str(err)
    if isinstance(err, UnidentifiedImageError) or "BytesIO" in why:
        why = f"not an image format PIL reads, {len(blob)} bytes"
    return DataError(f"{where}: unreadable image ({why})")


def _decode(blob: bytes, where: str, size: int) -> Tensor:
    try:
        img = Image.open(io.BytesIO(blob)).convert("RGB")
    except _BAD_IMAGE as err:
        raise unreadable(where, blob, err) from None
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
    out = d.model_dump(mode="json", exclude={"workers", "augment"})
    if d.real_labels and Path(d.real_labels).is_file():  # its content decides the val set
        out["real_labels_sha256"] = _digest(Path(d.real_labels), "sha256")
    return out


# ---------------------------------------------------------------- ImageNet's ReaL labels
_VAL_NUMBER = re.compile(r"ILSVRC2012_val_(\d{8})\.")


def read_real_labels(path: str) -> list[list[int]]:
    """ReaL's real.json: for each validation image, in file-number order (entry i is
    ILSVRC2012_val_{i+1:08d}), the list of its ReaL labels; [] where raters kept none."""
    where = f"data.real_labels {path}"
    try:
        labels = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise DataError(f"{where} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DataError(f"{where} is not a readable JSON file ({err})") from None
    ok = isinstance(labels, list) and all(
        isinstance(e, list) and all(isinstance(c, int) and not isinstance(c, bool) for c in e)
        for e in labels
    )
    if not ok or not labels:
        raise DataError(
            f"{where} is not ReaL's real.json: a JSON list holding, for each validation "
            "image in file-number order, the list of its labels (ints)"
        )
    return labels


def real_labelled(members: list[str], labels: list[list[int]], path: str) -> list[bool]:
    """For each validation file, whether ReaL gives it a label: the images ReaL means to
    keep (`real_subset: labelled`), each found by its file number."""
    out = []
    for m in members:
        found = _VAL_NUMBER.search(Path(m).name)
        if found is None:
            raise DataError(
                f"data.real_labels {path}: validation file {m} is not named "
                "ILSVRC2012_val_NNNNNNNN, so its ReaL entry can't be found"
            )
        i = int(found.group(1)) - 1
        if not 0 <= i < len(labels):
            raise DataError(
                f"data.real_labels {path} has {len(labels)} entries; {m} needs entry {i + 1}"
            )
        out.append(bool(labels[i]))
    return out


def authors_real_keep(ordered: list[str], labels: list[list[int]], path: str) -> list[bool]:
    """For each validation file in ImageFolder's order (class folders sorted, files sorted
    in each), whether the authors' `use_real` kept it (`real_subset: authors`): they
    deleted `samples[p]` for every position p whose real.json entry is empty, p counted in
    that order, while real.json's entries follow file numbers. So the images kept are as
    many as ReaL labels, but a different set (on ImageNet 2,945 of 46,837 differ). Only on
    the whole validation set, where those positions mean anything."""
    if len(ordered) != len(labels):
        raise DataError(
            f"data.real_labels {path} has {len(labels)} entries and the validation set "
            f"{len(ordered)} images: real_subset=authors keeps images by position, so it "
            "needs the whole validation set"
        )
    return [bool(entry) for entry in labels]


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
    """Verify the source and write `d.prepared`; skipped when it is already up to date and
    whole (every file as this step recorded it), prepared again when it is damaged."""
    out = _prepared_folder(d)
    _clear_leftovers(out)  # on every path: an up-to-date folder may have a killed run's too
    meta = _prepared_meta(out)
    if meta is not None and meta.get("config") == fingerprint(d):
        damage = damaged(d, meta)
        if damage is None:
            return meta
        print(f"[prepare] {damage}: preparing it again", flush=True)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        meta = _prepare_into(d, tmp)
        meta["files"] = {
            f.name: dict(bytes=f.stat().st_size, sha256=_sha256(f))
            for f in sorted(tmp.glob("*.pt")) + sorted(tmp.glob("*.index.json"))
        }
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


# ---------------------------------------------------------------- a prepared folder, whole
PREPARE_AGAIN = "prepare it again: python -m abtrain prepare --config FILE (or dvc repro prepare)"


def problem(d: ImageData) -> str | None:
    """Why training can't read `d.prepared` (None: it can): not prepared, prepared from
    another data config, or damaged since (`damaged`). One line, with the fix."""
    meta_path = Path(d.prepared) / "meta.json"
    if not meta_path.exists():
        return f"{d.prepared} is not prepared: run `python -m abtrain prepare --config ...` first"
    meta = _prepared_meta(Path(d.prepared))
    if meta is None:
        return f"{meta_path} is unreadable or not abtrain's: {PREPARE_AGAIN}"
    if meta.get("config") != fingerprint(d):
        return f"{d.prepared} was prepared from another data config: {PREPARE_AGAIN}"
    damage = damaged(d, meta)
    return f"{damage}: {PREPARE_AGAIN}" if damage else None


def damaged(d: ImageData, meta: dict[str, Any]) -> str | None:
    """What in `d.prepared` is no longer as the prepare step wrote it, in a few words naming
    the file (None: all is whole): each split file against its recorded size and sha256,
    and each image a split indexes (in the source folder, or copied out of an archive)
    against its size then. Each file read once, each image only stat'ed: a start-up cost
    of one pass over the cached tensors and one stat per image."""
    root = Path(d.prepared)
    files = meta.get("files")
    if not isinstance(files, dict):
        return f"{root} was prepared by an older abtrain, without a record of its files"
    for name, want in files.items():
        why = file_problem(root / name, want)
        if why:
            return why
    for name in files:
        if name.endswith(".index.json"):
            why = index_problem(root, root / name)
            if why:
                return why
    return None


def file_problem(path: Path, want: dict[str, Any], data: bytes | None = None) -> str | None:
    """`path` (or its bytes already read, `data`) against the size and sha256 prepare
    recorded: None, or what is wrong, naming the file."""
    import hashlib

    try:
        size = len(data) if data is not None else path.stat().st_size
    except FileNotFoundError:
        return f"{path} is missing"
    if size != want["bytes"]:
        return f"{path} is damaged ({size:,} bytes, {want['bytes']:,} when prepared)"
    digest = hashlib.sha256(data).hexdigest() if data is not None else _sha256(path)
    if digest != want["sha256"]:
        return f"{path} is damaged (its sha256 differs from the one recorded when prepared)"
    return None


def _sha256(path: Path) -> str:
    import hashlib

    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def index_problem(root: Path, index: Path) -> str | None:
    """The images `index` names (with the size each had when prepared): the first that is
    gone or another size, and how many are."""
    entries = json.loads(index.read_text())
    bad, first = 0, None
    for entry in entries:
        path = root / entry[0]  # an absolute path (a folder source) stays itself
        try:
            size = path.stat().st_size
        except OSError:
            size = None
        if size is None or (len(entry) > 2 and size != entry[2]):
            bad += 1
            if first is None:
                now = "missing" if size is None else f"{size:,} bytes, {entry[2]:,} when prepared"
                first = f"{path} ({now})"
    if bad:
        return f"{bad:,} of the {len(entries):,} images {index.name} names changed since prepare: {first}"
    return None


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
            real = d.real_labels if split == "val" else None
            y, members = _select(tree, split, per_class, real, d.real_subset)
            if cached:
                x = _decode_all(tree, members, d.image_size, split)
                torch.save(dict(x=x, y=y), tmp / f"{split}.pt")
            else:
                _verify_and_index(tree, members, y, tmp, split, d.image_size)
        counts[split] = {classes[c]: int((y == c).sum()) for c in range(len(classes))}
    meta["counts"] = counts
    if d.real_labels:
        meta["real_labels"] = str(d.real_labels)  # the val counts are of the images it keeps
    if cached:
        x = torch.load(tmp / "train.pt", weights_only=True)["x"].float() / 255
        meta["mean"] = x.mean(dim=(0, 2, 3)).tolist()
        meta["std"] = x.std(dim=(0, 2, 3)).tolist()
    else:
        meta["mean"], meta["std"] = IMAGENET_STATS
    return meta


def _select(
    tree: _Tree,
    split: str,
    per_class: int,
    real_labels: str | None = None,
    real_subset: str | None = None,
) -> tuple[Tensor, list[str]]:
    """The images of `split` (per class: the first `per_class`, 0 all), with their labels;
    with `real_labels` only those ReaL keeps (`real_subset`: those it labels, or the
    authors' positions), chosen before the per-class cut."""
    members, labels = [], []
    files_of = {
        cls: [f for f in tree.splits[split][cls] if Path(f).suffix.lower() in IMAGE_SUFFIXES]
        for cls in tree.classes
    }
    keep: dict[str, bool] | None = None
    if real_labels:
        real = read_real_labels(real_labels)
        ordered = [f for cls in tree.classes for f in files_of[cls]]  # ImageFolder's order
        rule = authors_real_keep if real_subset == "authors" else real_labelled
        keep = dict(zip(ordered, rule(ordered, real, real_labels)))
    for c, cls in enumerate(tree.classes):
        files = files_of[cls]
        if keep is not None:
            files = [f for f in files if keep[f]]
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


def _size(tmp: Path, path: str) -> int:
    """An indexed image's size now (relative paths: under the folder being written)."""
    return (tmp / path).stat().st_size


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
            raise unreadable(where, blob, err) from None
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
    index = [[path[m], label[m], _size(tmp, path[m])] for m in members]
    (tmp / f"{split}.index.json").write_text(json.dumps(index))
