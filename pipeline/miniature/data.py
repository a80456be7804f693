"""The miniature's data, generated in the real formats: an ImageNet-style tree of JPEGs as
a GNU tar archive, CIFAR-100 and CIFAR-10 python archives (Python 2 pickles), and the
training images each prepared folder will hold."""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import struct
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

# Generated data: ImageNet-style classes (WordNet ids) and images per class and split.
WNIDS = ("n01440764", "n01443537", "n01484850")
IMAGENET_PER_CLASS = {"train": 4, "val": 2}  # 12 training images: an epoch of 3 steps
JPEG_SIZES = ((500, 375), (375, 500), (256, 256), (320, 240), (480, 480))
CIFAR100_PER_CLASS = {"train": 5, "test": 1}
CIFAR10_PER_CLASS = {"train": 2, "val": 1}  # the real images' subset


class _Py2Pickler(pickle._Pickler):
    """Protocol 2 as Python 2's cPickle wrote the CIFAR batches: `bytes` become py2 `str`
    (SHORT_BINSTRING/BINSTRING), so `pickle.load(f, encoding="bytes")` gives b"data" keys
    and `encoding="latin1"` gives "data", as with the published files."""

    dispatch = dict(pickle._Pickler.dispatch)

    def save_py2_str(self, obj: bytes) -> None:
        if len(obj) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(obj)]) + obj)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(obj)) + obj)
        self.memoize(obj)

    dispatch[bytes] = save_py2_str


def py2_pickle(obj: Any) -> bytes:
    buf = io.BytesIO()
    _Py2Pickler(buf, protocol=2).dump(obj)
    return buf.getvalue()


def _image(rng: np.random.Generator, c: int, classes: int, h: int, w: int) -> np.ndarray:
    """A smooth, class-coloured image with a little noise (learnable, small as a JPEG)."""
    hue = np.array([np.cos(2 * np.pi * (c / classes + k / 3)) for k in range(3)])
    y, x = np.mgrid[0:h, 0:w]
    ramp = (x / max(w - 1, 1) + y / max(h - 1, 1))[..., None] / 2
    px = 128 + 90 * hue * (0.5 + ramp) + rng.normal(0, 12, (h, w, 3))
    return np.clip(px, 0, 255).astype(np.uint8)


def _tar(folder: Path, member: str, archive: Path, gzip: bool) -> None:
    """The system's GNU tar (its member order and headers, as real archives have)."""
    flags = "-czf" if gzip else "-cf"
    subprocess.run(["tar", flags, str(archive), "-C", str(folder), member], check=True)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_imagenet(dest: Path, rng: np.random.Generator) -> tuple[Path, int]:
    """imagenet-mini.tar: imagenet-mini/{train,val}/<wnid>/*.JPEG, 240-500 px JPEGs."""
    from PIL import Image

    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        root = Path(tmp) / "imagenet-mini"
        k, v = 0, 0  # every image; the validation images, numbered from 1 as ImageNet's
        for split, n in IMAGENET_PER_CLASS.items():
            for c, wnid in enumerate(WNIDS):
                (root / split / wnid).mkdir(parents=True)
                for i in range(n):
                    w, h = JPEG_SIZES[k % len(JPEG_SIZES)]
                    k += 1
                    v += split == "val"
                    name = (
                        f"{wnid}_{1000 + i}.JPEG"
                        if split == "train"
                        else f"ILSVRC2012_val_{v:08d}.JPEG"
                    )
                    img = Image.fromarray(_image(rng, c, len(WNIDS), h, w))
                    img.save(root / split / wnid / name, "JPEG", quality=85)
        archive = dest / "imagenet-mini.tar"
        _tar(Path(tmp), "imagenet-mini", archive, gzip=False)
    # ReaL's real.json for it, one entry a validation image (entry i: ILSVRC2012_val_{i+1}),
    # as the real one has: the authors' positional rule (data.real_subset: authors) needs it
    real = [[i // IMAGENET_PER_CLASS["val"]] for i in range(v)]
    (dest / "imagenet-mini-real.json").write_text(json.dumps(real))
    return archive, len(WNIDS) * IMAGENET_PER_CLASS["train"]


def _cifar_rows(rng: np.random.Generator, labels: list[int], classes: int) -> np.ndarray:
    """uint8 (N, 3072): each row the red plane, then green, then blue (32 × 32, row-major)."""
    return np.stack(
        [_image(rng, c, classes, 32, 32).transpose(2, 0, 1).reshape(-1) for c in labels]
    )


def write_cifar100(dest: Path, rng: np.random.Generator) -> tuple[Path, int]:
    """cifar-100-python-mini.tar.gz: cifar-100-python/{train,test,meta} as published.

    Named apart from `cifar-100-python.tar.gz`, whose md5 abtrain/data/sources.py checks against the
    published archive's; its own sha256 is given as data.sha256 instead.
    """
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        folder = Path(tmp) / "cifar-100-python"
        folder.mkdir()
        fine = [f"fine_{i:02d}".encode() for i in range(100)]
        coarse = [f"coarse_{i:02d}".encode() for i in range(20)]
        for split, n in CIFAR100_PER_CLASS.items():
            labels = [c for c in range(100) for _ in range(n)]
            rng.shuffle(labels)
            data = _cifar_rows(rng, labels, 100)
            batch = {
                b"filenames": [b"%s_s_%06d.png" % (fine[c], i) for i, c in enumerate(labels)],
                b"batch_label": f"{'training' if split == 'train' else 'testing'} batch 1 of 1".encode(),
                b"fine_labels": [int(c) for c in labels],
                b"coarse_labels": [int(c) // 5 for c in labels],
                b"data": data,
            }
            (folder / split).write_bytes(py2_pickle(batch))
        meta = {b"fine_label_names": fine, b"coarse_label_names": coarse}
        (folder / "meta").write_bytes(py2_pickle(meta))
        archive = dest / "cifar-100-python-mini.tar.gz"
        _tar(Path(tmp), "cifar-100-python", archive, gzip=True)
    return archive, 100 * CIFAR100_PER_CLASS["train"]


def write_cifar10(dest: Path, rng: np.random.Generator) -> Path:
    """cifar-10-python-mini.tar.gz: cifar-10-batches-py/{data_batch_1..5,test_batch,
    batches.meta} as published (for machines without the real images)."""
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        folder = Path(tmp) / "cifar-10-batches-py"
        folder.mkdir()
        names = [
            b"airplane",
            b"automobile",
            b"bird",
            b"cat",
            b"deer",
            b"dog",
            b"frog",
            b"horse",
            b"ship",
            b"truck",
        ]
        batches = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
        for i, name in enumerate(batches):
            labels = [c for c in range(10) for _ in range(2)]
            rng.shuffle(labels)
            data = _cifar_rows(rng, labels, 10)
            batch = {
                b"batch_label": (
                    f"training batch {i + 1} of 5" if i < 5 else "testing batch 1 of 1"
                ).encode(),
                b"labels": [int(c) for c in labels],
                b"data": data,
                b"filenames": [b"%s_s_%06d.png" % (names[c], j) for j, c in enumerate(labels)],
            }
            (folder / name).write_bytes(py2_pickle(batch))
        meta = {b"num_cases_per_batch": 20, b"label_names": names, b"num_vis": 3072}
        (folder / "batches.meta").write_bytes(py2_pickle(meta))
        archive = dest / "cifar-10-python-mini.tar.gz"
        _tar(Path(tmp), "cifar-10-batches-py", archive, gzip=True)
    return archive


def write_sources(dest: Path, cifar10: Path | None) -> tuple[dict[str, Any], dict[str, int]]:
    """The data sources and the training images each prepared folder will hold."""
    dest.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    imagenet, n_imagenet = write_imagenet(dest, rng)
    cifar100, n_cifar100 = write_cifar100(dest, rng)
    if cifar10 is not None and cifar10.is_file():  # the real images, as an ImageFolder
        c10 = dict(name="imagefolder", source=str(cifar10.resolve()), sha256=sha256(cifar10))
    else:
        archive = write_cifar10(dest, rng)
        c10 = dict(source=str(archive), sha256=sha256(archive))
    src = dict(
        imagenet=str(imagenet),
        imagenet_sha256=sha256(imagenet),
        imagenet_real=str(dest / "imagenet-mini-real.json"),
        cifar100=str(cifar100),
        cifar100_sha256=sha256(cifar100),
        cifar10_data=c10,
    )
    counts = {
        "data/prepared/imagenet": n_imagenet,
        "data/prepared/cifar100": n_cifar100,
        "data/prepared/cifar10": 10 * CIFAR10_PER_CLASS["train"],
    }
    return src, counts
