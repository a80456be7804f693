import hashlib
import io
import json
import multiprocessing
import os
import pickle
import pickletools
import random
import re
import signal
import struct
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from shutil import rmtree

import numpy as np
import pytest
import torch
from PIL import Image

from abtrain import config
from abtrain.data import datasets, loader, prepare, sources
from tests.helpers import ROOT, tiny_config

SHARED_CIFAR = ROOT.parent / "shared" / "data" / "cifar10-jpg.tar.gz"


def image_cfg(**fields):
    d = dict(
        name="imagefolder",
        source=None,
        sha256=None,
        prepared="",
        train_per_class=0,
        val_per_class=0,
        real_labels=None,
        image_size=32,
        augment=True,
        workers=2,
    )
    d.update(fields)
    if d["real_labels"] is not None:
        d.setdefault("real_subset", "labelled")
    return config.ImageData(**d)


# ---------------------------------------------------------------- CIFAR python batches
def write_cifar(root: Path, name: str = "cifar10", per_batch: int = 20, seed: int = 0) -> dict:
    """The original python-version layout, with random pixels; returns what was written."""
    rng = np.random.default_rng(seed)
    spec = sources.CIFAR[name]
    folder = root / spec["folder"]
    folder.mkdir(parents=True)
    classes = 10 if name == "cifar10" else 100
    written = {"train": [], "val": []}
    for split in ("train", "val"):
        for batch_name in spec[split]:
            x = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
            y = [i % classes for i in range(per_batch)]
            (folder / batch_name).write_bytes(pickle.dumps({"data": x, spec["labels"]: y}))
            written[split].append((x, y))
    meta_name, key = spec["meta"]
    (folder / meta_name).write_bytes(pickle.dumps({key: [f"class{i}" for i in range(classes)]}))
    return written


@pytest.mark.parametrize("as_archive", [False, True])
def test_cifar10_pickles_load_pixel_exact_from_folder_or_archive(tmp_path, as_archive):
    written = write_cifar(tmp_path / "src")
    source = tmp_path / "src"
    if as_archive:
        source = tmp_path / "cifar.tar.gz"
        with tarfile.open(source, "w:gz") as tar:
            tar.add(tmp_path / "src" / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    d = image_cfg(name="cifar10", source=str(source), prepared=str(tmp_path / "prep"))
    meta = prepare.prepare(d)
    assert meta["classes"] == [f"class{i}" for i in range(10)] and meta["cached"]
    assert (
        sum(meta["counts"]["train"].values()) == 100 and sum(meta["counts"]["val"].values()) == 20
    )
    train = torch.load(tmp_path / "prep" / "train.pt", weights_only=True)
    first = torch.as_tensor(written["train"][0][0]).view(-1, 3, 32, 32)
    assert torch.equal(train["x"][:20], first) and train["y"][:3].tolist() == [0, 1, 2]


def test_cifar100_fine_labels_and_stratified_subset(tmp_path):
    write_cifar(tmp_path / "src", "cifar100", per_batch=300)
    d = image_cfg(
        name="cifar100",
        source=str(tmp_path / "src"),
        prepared=str(tmp_path / "p"),
        train_per_class=2,
        val_per_class=1,
        real_labels=None,
    )
    meta = prepare.prepare(d)
    assert len(meta["classes"]) == 100
    assert set(meta["counts"]["train"].values()) == {2} and set(meta["counts"]["val"].values()) == {
        1
    }


# ---------------------------------------------------------------- ImageFolder trees
def write_tree(
    root: Path, classes=("cat", "dog"), per_class=3, size=40, split_names=("train", "val")
):
    rng = np.random.default_rng(0)
    for split in split_names:
        for cls in classes:
            (root / split / cls).mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / cls / f"{i}.png")


@pytest.mark.parametrize("as_archive", [False, True])
def test_imagefolder_tree_is_cached_when_small(tmp_path, as_archive):
    write_tree(tmp_path / "tree" / "mydata", split_names=("train", "test"))
    source = tmp_path / "tree"
    if as_archive:
        source = tmp_path / "tree.tar"
        with tarfile.open(source, "w") as tar:
            tar.add(tmp_path / "tree" / "mydata", arcname="mydata")
    d = image_cfg(source=str(source), prepared=str(tmp_path / "p"))
    meta = prepare.prepare(d)
    assert meta["classes"] == ["cat", "dog"] and meta["cached"]
    assert meta["counts"] == {"train": {"cat": 3, "dog": 3}, "val": {"cat": 3, "dog": 3}}
    val = torch.load(tmp_path / "p" / "val.pt", weights_only=True)
    assert val["x"].shape == (6, 3, 32, 32) and val["y"].tolist() == [0, 0, 0, 1, 1, 1]


def test_large_images_stay_files_and_batches_are_reproducible(tmp_path):
    write_tree(tmp_path / "tree", per_class=4, size=80)
    with tarfile.open(tmp_path / "tree.tar.gz", "w:gz") as tar:
        tar.add(tmp_path / "tree", arcname="imagenet")
    cfg = tiny_config(
        "batch_size=2",
        f"data={{name: imagenet, source: {tmp_path / 'tree.tar.gz'}, sha256: null, "
        f"prepared: {tmp_path / 'p'}, train_per_class: 0, val_per_class: 0, real_labels: null, image_size: 72, "
        "augment: true, workers: 2}",
    )
    meta = prepare.prepare(cfg.data)
    assert not meta["cached"] and (tmp_path / "p" / "files").is_dir()
    task = datasets.make_task(cfg)
    sampler = loader.StepSampler(len(task), 2, rank=1, world_size=2, seed=0)
    x, y = task.train_batch(sampler, 3)
    assert x.shape == (2, 3, 72, 72) and y.shape == (2,)
    assert torch.equal(x, task.train_batch(sampler, 3)[0])  # (seed, step, rank) fixes it
    vx, vy = next(task.val_batches(0, 1, 8))
    assert vx.shape == (8, 3, 72, 72) and vy.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]


def test_the_real_cifar10_archive_through_the_normal_path(tmp_path):
    if not SHARED_CIFAR.exists():
        pytest.skip(f"{SHARED_CIFAR} not present")
    d = image_cfg(
        source=str(SHARED_CIFAR),
        prepared=str(tmp_path / "p"),
        train_per_class=50,
        val_per_class=10,
        real_labels=None,
        sha256="7854ea059adc7729ab5267c5269ccc01e6eaeea6549d5f3c834c106bae86e8ee",
    )
    meta = prepare.prepare(d)
    assert meta["classes"][:3] == ["airplane", "automobile", "bird"] and len(meta["classes"]) == 10
    assert set(meta["counts"]["train"].values()) == {50} and set(
        meta["counts"]["val"].values()
    ) == {10}
    assert meta["mean"] == pytest.approx([0.49, 0.48, 0.45], abs=0.05)


def test_cifar_augmentation_pads_crops_and_flips_deterministically():
    x = torch.arange(2 * 3 * 8 * 8, dtype=torch.uint8).view(2, 3, 8, 8)
    a = loader._augment(x, torch.Generator().manual_seed(1))
    b = loader._augment(x, torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and a.shape == x.shape


def test_step_sampler_ranks_together_see_the_single_process_batch():
    single = loader.StepSampler(100, 8, 0, 1, seed=3)
    for step in (0, 5, 12, 13):  # 12 steps per epoch: 13 is in the next epoch
        parts = [loader.StepSampler(100, 2, r, 4, seed=3).indices(step) for r in range(4)]
        assert torch.equal(torch.cat(parts), single.indices(step))


# ---------------------------------------------------------------- bad input
def bad_png(path: Path):
    path.write_bytes(b"not an image at all")


@pytest.mark.parametrize(
    "make,expect",
    [
        (lambda root: None, "does not exist"),
        (lambda root: root.mkdir(), "no train/<class>/ and val/<class>/"),
        (
            lambda root: (write_tree(root), [p.unlink() for p in (root / "val" / "dog").iterdir()]),
            "class folder val/dog holds no images",
        ),
        (
            lambda root: (write_tree(root), bad_png(root / "train" / "cat" / "0.png")),
            "train/cat/0.png: unreadable image",
        ),
        (  # as a copy cut short leaves it; not PIL's `<_io.BytesIO object at 0x...>`
            lambda root: (write_tree(root), (root / "val" / "dog" / "1.png").write_bytes(b"")),
            r"val/dog/1.png: unreadable image \(an empty file, 0 bytes\)$",
        ),
        (
            lambda root: (write_tree(root), (root / "train" / "cat" / "2.png").write_text("hi")),
            r"train/cat/2.png: unreadable image \(not an image format PIL reads, 2 bytes\)$",
        ),
        (  # the class the split lacks, by name
            lambda root: (
                write_tree(root, classes=("cat", "dog", "owl")),
                rmtree(root / "val/owl"),
            ),
            r"train and val hold different class folders: val \(or test\)/ has no owl$",
        ),
    ],
)
def test_prepare_rejects_bad_trees_naming_the_path_and_leaves_nothing(tmp_path, make, expect):
    root = tmp_path / "tree"
    make(root)
    out = tmp_path / "p"
    with pytest.raises(sources.DataError, match=expect) as err:
        prepare.prepare(image_cfg(source=str(root), prepared=str(out)))
    assert str(root) in str(err.value)
    assert not out.exists() and not list(tmp_path.glob(".p.tmp*"))


def test_prepare_rejects_a_wrong_checksum(tmp_path):
    write_tree(tmp_path / "tree")
    with tarfile.open(tmp_path / "t.tar", "w") as tar:
        tar.add(tmp_path / "tree", arcname="t")
    with pytest.raises(sources.DataError, match=r"t\.tar: sha256 does not match"):
        prepare.prepare(
            image_cfg(source=str(tmp_path / "t.tar"), sha256="0" * 64, prepared=str(tmp_path / "p"))
        )
    fake = tmp_path / "cifar-10-python.tar.gz"  # CIFAR's own archive name: md5 is checked
    fake.write_bytes(b"x" * 100)
    with pytest.raises(sources.DataError, match="md5 does not match the published cifar10"):
        prepare.prepare(image_cfg(name="cifar10", source=str(fake), prepared=str(tmp_path / "p")))
    assert not (tmp_path / "p").exists()


def test_prepare_rejects_a_broken_cifar_batch(tmp_path):
    write_cifar(tmp_path / "src")
    (tmp_path / "src" / "cifar-10-batches-py" / "data_batch_3").write_bytes(b"garbage")
    with pytest.raises(sources.DataError, match="data_batch_3: not a CIFAR python batch"):
        prepare.prepare(
            image_cfg(name="cifar10", source=str(tmp_path / "src"), prepared=str(tmp_path / "p"))
        )


def test_unknown_data_set_name_is_a_config_error():
    with pytest.raises(config.ConfigError, match=r"data"):
        tiny_config("data={name: mnist, source: x}")


def test_training_refuses_unprepared_or_stale_data(tmp_path):
    cfg = tiny_config(
        f"data={{name: imagefolder, source: {tmp_path}, sha256: null, prepared: {tmp_path / 'p'}, "
        "train_per_class: 0, val_per_class: 0, real_labels: null, image_size: 32, augment: true, workers: 1}"
    )
    with pytest.raises(sources.DataError, match="is not prepared"):
        datasets.make_task(cfg)
    write_tree(tmp_path)
    prepare.prepare(cfg.data)
    datasets.make_task(cfg)
    stale = cfg.model_copy(update={"data": cfg.data.model_copy(update={"train_per_class": 1})})
    with pytest.raises(sources.DataError, match="another data config"):
        datasets.make_task(stale)


# ---------------------------------------------------------------- batches ahead of the step
def write_jpeg_tree(root: Path, classes=("cat", "dog"), per_class=6, sizes=((80, 96), (96, 88))):
    """Photo-like JPEGs (smooth gradients and noise) of the given (width, height) sizes."""
    rng = np.random.default_rng(1)
    for split in ("train", "val"):
        for cls in classes:
            (root / split / cls).mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                w, h = sizes[i % len(sizes)]
                Image.fromarray(photo(rng, w, h)).save(root / split / cls / f"{i}.jpg", quality=90)


def photo(rng: np.random.Generator, w: int, h: int) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w] / max(w, h)
    base = [np.sin(6 * xx * rng.uniform(0.5, 2) + 4 * yy * c) for c in rng.uniform(-1, 1, 3)]
    pixels = 127 + 100 * np.stack(base, -1) + rng.normal(0, 6, (h, w, 3))
    return pixels.clip(0, 255).astype(np.uint8)


def file_task(tmp_path: Path, workers: int = 2, augment: bool = True, batch: int = 3):
    write_jpeg_tree(tmp_path / "tree")
    cfg = tiny_config(
        f"batch_size={batch}",
        f"data={{name: imagenet, source: {tmp_path / 'tree'}, sha256: null, "
        f"prepared: {tmp_path / 'p'}, train_per_class: 0, val_per_class: 0, real_labels: null, image_size: 72, "
        f"augment: {str(augment).lower()}, workers: {workers}}}",
    )
    prepare.prepare(cfg.data)
    task = datasets.make_task(cfg)
    assert not task.meta["cached"]
    return task


def cached_task(tmp_path: Path, workers: int = 2):
    write_tree(tmp_path / "tree", per_class=6)
    d = image_cfg(source=str(tmp_path / "tree"), prepared=str(tmp_path / "p"), workers=workers)
    prepare.prepare(d)
    task = datasets.make_task(tiny_config().model_copy(update={"data": d}))
    assert task.meta["cached"]
    return task


def assert_same_batches(got, want):
    assert len(got) == len(want)
    for (x, y), (wx, wy) in zip(got, want):
        assert x.dtype == wx.dtype and torch.equal(x, wx) and torch.equal(y, wy)


@pytest.mark.parametrize("kind", ["files", "cached"])
def test_train_batches_equal_train_batch_bit_for_bit_and_resume_mid_run(tmp_path, kind):
    task = file_task(tmp_path) if kind == "files" else cached_task(tmp_path)
    sampler = loader.StepSampler(len(task), 3, rank=1, world_size=2, seed=5)
    steps = 2 * sampler.steps_per_epoch + 1  # crosses two epoch boundaries
    want = [task.train_batch(sampler, s) for s in range(steps)]
    assert_same_batches(list(task.train_batches(sampler, 0, steps)), want)
    assert_same_batches(list(task.train_batches(sampler, 3, steps)), want[3:])
    assert list(task.train_batches(sampler, 4, 4)) == []


def test_train_batches_decode_in_worker_processes_ahead_of_the_consumer(tmp_path, monkeypatch):
    task = file_task(tmp_path)
    log = tmp_path / "pids"
    load = loader._load

    def spying_load(path, size, g):
        with open(log, "a") as f:  # one short append per line: atomic between processes
            f.write(f"{os.getpid()}\n")
        return load(path, size, g)

    monkeypatch.setattr(datasets, "_load", spying_load)  # the forked workers inherit it
    sampler = loader.StepSampler(len(task), 3, rank=0, world_size=1, seed=0)
    batches = task.train_batches(sampler, 0, 3 * sampler.steps_per_epoch)
    next(batches)
    deadline = time.monotonic() + 30
    while len(log.read_text().split()) < 4 * 3:
        loaded = len(log.read_text().split())
        assert time.monotonic() < deadline, f"the workers loaded {loaded} of 12 images in 30 s"
        time.sleep(0.05)
    pids = [int(p) for p in log.read_text().split()]
    # one batch consumed, four built: two workers with two batches each in flight
    assert len(pids) >= 4 * 3 and len(set(pids)) == 2 and os.getpid() not in pids
    batches.close()  # the consumer stops early: the workers go with the iterator
    for pid in set(pids):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_rank_killed_outright_takes_its_busy_data_workers_with_it(tmp_path, monkeypatch):
    """SIGKILL of the process reading the batches (a rank, as the OOM killer or a dead
    torchrun ends it) while its workers decode: they end at once, not after their image."""
    task = file_task(tmp_path)
    log = tmp_path / "pids"
    load = loader._load

    def slow_load(path, size, g):
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(120)  # a worker busy with its image when the rank dies
        return load(path, size, g)

    monkeypatch.setattr(datasets, "_load", slow_load)  # the forked rank and workers inherit it

    def rank() -> None:
        sampler = loader.StepSampler(len(task), 3, rank=0, world_size=1, seed=0)
        next(task.train_batches(sampler, 0, 4))

    proc = multiprocessing.get_context("fork").Process(target=rank)
    proc.start()
    deadline = time.monotonic() + 60
    while not log.exists() or len(set(log.read_text().split())) < 2:
        assert time.monotonic() < deadline and proc.is_alive(), "no two workers at work"
        time.sleep(0.05)
    workers = {int(p) for p in log.read_text().split()}
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    deadline = time.monotonic() + 10
    while left := [w for w in workers if alive(w)]:
        assert time.monotonic() < deadline, f"workers {left} outlived their rank"
        time.sleep(0.05)


def alive(pid: int) -> bool:
    """Running, not a zombie (a worker whose rank is gone is reaped by init, not at once)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.parametrize("kind", ["files", "cached"])
def test_ranks_together_see_and_augment_as_one_process_with_the_whole_batch(tmp_path, kind):
    task = file_task(tmp_path) if kind == "files" else cached_task(tmp_path)
    one = loader.StepSampler(len(task), 4, rank=0, world_size=1, seed=2)
    ranks = [loader.StepSampler(len(task), 2, rank=r, world_size=2, seed=2) for r in range(2)]
    for step in range(one.steps_per_epoch + 1):
        x, y = task.train_batch(one, step)
        parts = [next(task.train_batches(s, step, step + 1)) for s in ranks]
        assert torch.equal(torch.cat([p[0] for p in parts]), x)
        assert torch.equal(torch.cat([p[1] for p in parts]), y)


def test_val_batches_through_workers_equal_in_process(tmp_path):
    task = file_task(tmp_path, workers=2)
    ahead = list(task.val_batches(1, 2, 4))
    task.workers = 0
    assert_same_batches(ahead, list(task.val_batches(1, 2, 4)))
    assert [len(y) for _, y in ahead] == [4, 2] and ahead[0][0].shape == (4, 3, 72, 72)


@pytest.mark.parametrize("hw", [(375, 500), (96, 80), (10, 400), (400, 10), (1, 1)])
def test_crop_box_is_torchvisions_drawn_from_our_generator(hw):
    from torchvision.transforms import v2

    h, w = hw
    for seed in range(40):
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            tv = v2.RandomResizedCrop(8).make_params([torch.empty(3, h, w)])
        ours = loader.crop_params(h, w, torch.Generator().manual_seed(seed))
        assert ours == (tv["top"], tv["left"], tv["height"], tv["width"]), (hw, seed)


def test_augmented_image_is_torchvisions_random_resized_crop_and_flip(tmp_path):
    from torchvision.transforms import v2

    write_jpeg_tree(tmp_path, per_class=2, sizes=((120, 90), (90, 130)))
    tv = v2.Compose([v2.RandomResizedCrop(72), v2.RandomHorizontalFlip(), v2.PILToTensor()])
    for i, path in enumerate(sorted((tmp_path / "train").rglob("*.jpg"))):
        for seed in range(6):
            with torch.random.fork_rng():
                torch.manual_seed(seed + 10 * i)
                want = tv(Image.open(path).convert("RGB"))
            got = loader._load(str(path), 72, torch.Generator().manual_seed(seed + 10 * i))
            assert torch.equal(got, want)


def test_large_jpegs_decode_reduced_only_where_the_output_keeps_its_detail(tmp_path, monkeypatch):
    path = tmp_path / "big.jpg"
    Image.fromarray(photo(np.random.default_rng(3), 1000, 750)).save(path, quality=90)
    small = tmp_path / "small.png"
    Image.fromarray(photo(np.random.default_rng(4), 1000, 750)).save(small)
    assert loader._draft(Image.open(path), 96 / 800, 96 / 600) == 4  # 800x600 box -> 200x150
    assert loader._draft(Image.open(path), 96 / 300, 96 / 300) == 2  # 300x300 box -> 150x150
    assert loader._draft(Image.open(path), 96 / 150, 96 / 150) == 1  # would go below 96
    assert loader._draft(Image.open(small), 0.1, 0.1) == 1  # not a JPEG
    monkeypatch.setattr(loader, "crop_params", lambda h, w, g: (100, 50, 600, 800))
    reduced = [loader._load(str(path), 96, g) for g in (torch.Generator().manual_seed(0), None)]
    monkeypatch.setattr(loader, "_draft", lambda img, fx, fy: 1)
    full = [loader._load(str(path), 96, g) for g in (torch.Generator().manual_seed(0), None)]
    for a, b in zip(reduced, full):
        diff = (a.float() - b.float()).abs()
        assert a.shape == b.shape == (3, 96, 96) and diff.mean() < 1.5, diff.mean()


def test_a_file_batch_is_its_images_normalised_as_the_cached_ones_are(tmp_path):
    task = file_task(tmp_path)
    sampler = loader.StepSampler(len(task), 3, rank=1, world_size=2, seed=4)
    x, y = task.train_batch(sampler, 2)
    idx = sampler.indices(2).tolist()
    files = [os.path.join(task.root, os.fsdecode(task.train["files"][i])) for i in idx]
    images = [loader._load(f, 72, sampler.image_generator(2, j)) for j, f in enumerate(files)]
    assert torch.equal(x, task._normalize(torch.stack(images)))
    assert y.tolist() == [task.train["y"][i].item() for i in idx] and y.dtype == torch.int64


def test_an_image_gone_after_prepare_stops_training_naming_it_through_the_workers(tmp_path):
    task = file_task(tmp_path)
    sampler = loader.StepSampler(len(task), 3, rank=0, world_size=1, seed=0)
    gone = os.path.join(task.root, os.fsdecode(task.train["files"][sampler.indices(1)[0]]))
    Path(gone).write_bytes(b"truncated")
    with pytest.raises(sources.DataError, match=f"{gone}: unreadable image"):
        list(task.train_batches(sampler, 0, 3))


# ---------------------------------------------------------------- archives as users make them
COLOURS = {"ant": (220, 30, 30), "bee": (30, 200, 40), "cow": (40, 60, 230)}


def write_colour_tree(root: Path, per_class: int = 4, size: int = 80) -> list[str]:
    """An ImageFolder tree of JPEGs, each class one solid colour; returns the file paths."""
    paths = []
    for split in ("train", "val"):
        for cls, rgb in COLOURS.items():
            (root / split / cls).mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                path = f"{split}/{cls}/n{i:04d}.JPEG"
                Image.new("RGB", (size + 7 * i, size), rgb).save(root / path, "JPEG")
                paths.append(path)
    return paths


def assert_every_label_is_its_class(prepared: Path, meta: dict) -> None:
    for split in ("train", "val"):
        index = json.loads((prepared / f"{split}.index.json").read_text())
        assert len(index) == sum(meta["counts"][split].values())
        for file, label, *_ in index:
            cls = meta["classes"][label]
            assert Path(file).parts[-2] == cls, (file, cls)
            mean = np.asarray(Image.open(prepared / file).convert("RGB")).mean((0, 1))
            assert np.abs(mean - COLOURS[cls]).max() < 8, (file, cls, mean)


@pytest.mark.parametrize("flags", ["-cf", "-czf"])
def test_an_archive_made_by_gnu_tar_in_its_own_member_order_keeps_every_label(tmp_path, flags):
    paths = write_colour_tree(tmp_path / "imagenet")
    # GNU tar stores a folder's entries in readdir order, not sorted; listing the files in
    # a fixed shuffled order makes that reproducible
    random.Random(3).shuffle(paths)
    assert paths != sorted(paths)
    archive = tmp_path / ("imagenet.tar.gz" if "z" in flags else "imagenet.tar")
    subprocess.run(
        ["tar", flags, str(archive), "-C", str(tmp_path / "imagenet"), *paths], check=True
    )
    d = image_cfg(name="imagenet", source=str(archive), prepared=str(tmp_path / "p"), image_size=72)
    meta = prepare.prepare(d)
    assert not meta["cached"] and meta["classes"] == sorted(COLOURS)
    assert_every_label_is_its_class(tmp_path / "p", meta)


def test_a_folder_source_of_large_images_keeps_every_label(tmp_path):
    write_colour_tree(tmp_path / "imagenet")
    d = image_cfg(name="imagenet", source=str(tmp_path / "imagenet"), prepared=str(tmp_path / "p"))
    meta = prepare.prepare(d.model_copy(update={"image_size": 72}))
    assert_every_label_is_its_class(tmp_path / "p", meta)


def evil_archive(path: Path, tree: Path, evil: tarfile.TarInfo, payload: bytes) -> None:
    """A valid ImageFolder archive with one crafted member, as an attacker writes one."""
    with tarfile.open(path, "w") as tar:
        tar.add(tree, arcname="data")
        tar.addfile(evil, io.BytesIO(payload) if evil.isfile() else None)


def png_bytes() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (80, 80), (1, 2, 3)).save(buf, "PNG")
    return buf.getvalue()


@pytest.mark.parametrize(
    "name,kind",
    [
        ("train/cls/../../../evil.jpg", "file"),
        (
            "data/train/cat/../../../../../escaped/train/cat/evil.png",
            "file",
        ),  # an image to train on
        ("/abs/evil.jpg", "file"),
        ("{tmp}/abs/train/cat/evil.png", "file"),  # absolute, and where an image would be
        ("data/train/cat/link.png", "symlink"),
        ("data/train/cat/hard.png", "hardlink"),
    ],
)
def test_an_archive_member_leaving_the_prepared_folder_refuses_the_archive(tmp_path, name, kind):
    write_tree(tmp_path / "tree", size=80)
    work = tmp_path / "work"
    work.mkdir()
    name = name.format(tmp=tmp_path)
    evil = tarfile.TarInfo(name)
    payload = png_bytes()
    if kind == "file":
        evil.size = len(payload)
    else:
        evil.type = tarfile.SYMTYPE if kind == "symlink" else tarfile.LNKTYPE
        evil.linkname = "../../../../etc/passwd"
    archive = tmp_path / "evil.tar"
    evil_archive(archive, tmp_path / "tree", evil, payload)
    before = {p for p in tmp_path.rglob("*")}
    d = image_cfg(name="imagenet", source=str(archive), prepared=str(work / "p"), image_size=72)
    with pytest.raises(sources.DataError) as err:
        prepare.prepare(d)
    assert str(archive) in str(err.value) and repr(name) in str(err.value)
    assert {p for p in tmp_path.rglob("*")} == before  # nothing written, outside or in
    assert not Path("/abs").exists()


# ---------------------------------------------------------------- the prepared folder
def test_prepare_refuses_a_folder_of_the_users_and_keeps_its_files(tmp_path):
    write_tree(tmp_path / "tree")
    mine = tmp_path / "results"
    mine.mkdir()
    (mine / "thesis.tex").write_text("three years of work")
    with pytest.raises(
        sources.DataError, match=r"data\.prepared .*results.* is not a folder abtrain"
    ):
        prepare.prepare(image_cfg(source=str(tmp_path / "tree"), prepared=str(mine)))
    assert (mine / "thesis.tex").read_text() == "three years of work"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results", "tree"]


def test_prepare_refuses_a_prepared_folder_that_holds_the_source(tmp_path):
    data_dir = tmp_path / "data"
    write_tree(data_dir / "tree")
    d = image_cfg(source=str(data_dir / "tree"), prepared=str(data_dir))
    with pytest.raises(sources.DataError, match=r"data\.prepared .* holds data\.source"):
        prepare.prepare(d)
    assert len(list((data_dir / "tree").rglob("*.png"))) == 12
    same = image_cfg(source=str(data_dir / "tree"), prepared=str(data_dir / "tree"))
    with pytest.raises(sources.DataError, match=r"holds data\.source"):
        prepare.prepare(same)
    assert len(list((data_dir / "tree").rglob("*.png"))) == 12


def test_prepare_replaces_only_a_folder_it_prepared_itself(tmp_path):
    write_tree(tmp_path / "tree")
    d = image_cfg(source=str(tmp_path / "tree"), prepared=str(tmp_path / "p"))
    assert prepare.prepare(d)["counts"]["train"] == {"cat": 3, "dog": 3}
    meta = prepare.prepare(d.model_copy(update={"train_per_class": 1}))
    assert meta["counts"]["train"] == {"cat": 1, "dog": 1}
    assert json.loads((tmp_path / "p" / "meta.json").read_text())["counts"] == meta["counts"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p", "tree"]  # no .p.old / .p.tmp


def test_prepare_into_the_working_directory_is_refused_through_the_cli(tmp_path):
    write_tree(tmp_path / "tree")
    (tmp_path / "notes.txt").write_text("mine")
    cmd = [sys.executable, "-m", "abtrain", "prepare", "--config", str(ROOT / "params.yaml")]
    sets = [
        "data={name: imagefolder, source: tree, sha256: null, prepared: ., train_per_class: 0, "
        "val_per_class: 0, real_labels: null, image_size: 32, augment: true, workers: 0}"
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [*cmd, *(a for s in sets for a in ("--set", s))],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2, run.stderr
    assert "data.prepared '.'" in run.stderr and "working directory" in run.stderr
    assert "Traceback" not in run.stderr
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert len(list((tmp_path / "tree").rglob("*.png"))) == 12


# ---------------------------------------------------------------- CIFAR pickles
class Py2Pickler(pickle._Pickler):
    """Pickles bytes as Python 2's str (BINSTRING), as cPickle wrote the original batches."""

    dispatch = pickle._Pickler.dispatch.copy()

    def save_py2_str(self, obj: bytes) -> None:
        n = len(obj)
        if n < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([n]) + obj)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", n) + obj)
        self.memoize(obj)

    dispatch[bytes] = save_py2_str


def py2_pickle(obj) -> bytes:
    buf = io.BytesIO()
    Py2Pickler(buf, protocol=2).dump(obj)
    return buf.getvalue()


def write_original_cifar100(folder: Path, per_batch: int = 200) -> np.ndarray:
    """cifar-100-python as the original: Python 2 pickles (protocol 2) of str-keyed dicts."""
    rng = np.random.default_rng(7)
    folder.mkdir(parents=True)
    pixels = None
    for name in ("train", "test"):
        x = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
        pixels = x if pixels is None else pixels
        batch = {
            b"filenames": [b"img_%d.png" % i for i in range(per_batch)],
            b"batch_label": b"training batch 1 of 1",
            b"fine_labels": [i % 100 for i in range(per_batch)],
            b"coarse_labels": [i % 20 for i in range(per_batch)],
            b"data": x,
        }
        (folder / name).write_bytes(py2_pickle(batch))
    meta = {
        b"fine_label_names": [b"class%d" % i for i in range(100)],
        b"coarse_label_names": [b"super%d" % i for i in range(20)],
    }
    (folder / "meta").write_bytes(py2_pickle(meta))
    return pixels


def test_the_original_cifar100_pickles_still_load(tmp_path):
    pixels = write_original_cifar100(tmp_path / "src" / "cifar-100-python")
    globals_named = {
        arg
        for op, arg, _ in pickletools.genops((tmp_path / "src/cifar-100-python/train").read_bytes())
        if op.name == "GLOBAL"
    }
    assert globals_named == {"numpy.core.multiarray _reconstruct", "numpy ndarray", "numpy dtype"}
    d = image_cfg(name="cifar100", source=str(tmp_path / "src"), prepared=str(tmp_path / "p"))
    meta = prepare.prepare(d)
    assert meta["classes"][:2] == ["class0", "class1"] and len(meta["classes"]) == 100
    train = torch.load(tmp_path / "p" / "train.pt", weights_only=True)
    assert torch.equal(train["x"], torch.as_tensor(pixels).view(-1, 3, 32, 32))
    assert train["y"][:3].tolist() == [0, 1, 2]


class Payload:
    """What an attacker pickles: loading it calls `call` with `args`."""

    def __init__(self, call, *args) -> None:
        self.call, self.args = call, args

    def __reduce__(self):
        return self.call, self.args


@pytest.mark.parametrize("where", ["archive", "folder", "checksummed archive"])
@pytest.mark.parametrize("call", ["builtins.open", "os.system", "builtins.eval"])
def test_a_crafted_cifar_pickle_runs_no_code(tmp_path, monkeypatch, where, call):
    write_cifar(tmp_path / "src")
    marker = tmp_path / "pwned"
    payload = {
        "builtins.open": Payload(open, str(marker), "w"),
        "os.system": Payload(os.system, f"touch {marker}"),
        "builtins.eval": Payload(eval, f"open({str(marker)!r}, 'w')"),
    }[call]
    meta = tmp_path / "src" / "cifar-10-batches-py" / "batches.meta"
    meta.write_bytes(pickle.dumps({"label_names": payload}, protocol=2))
    source = tmp_path / "src"
    if where != "folder":
        name = "cifar-10-python.tar.gz" if where == "checksummed archive" else "cifar10.tgz"
        source = tmp_path / name
        with tarfile.open(source, "w:gz") as tar:
            tar.add(tmp_path / "src" / "cifar-10-batches-py", arcname="cifar-10-batches-py")
        if where == "checksummed archive":  # as if the published archive had been tampered
            spec = {**sources.CIFAR["cifar10"], "md5": sources._digest(source, "md5")}
            monkeypatch.setitem(sources.CIFAR, "cifar10", spec)
    d = image_cfg(name="cifar10", source=str(source), prepared=str(tmp_path / "p"))
    with pytest.raises(sources.DataError, match=r"batches\.meta: refused to unpickle") as err:
        prepare.prepare(d)
    assert str(source) in str(err.value)
    assert not marker.exists()
    assert not (tmp_path / "p").exists()


def test_prepare_tells_its_progress_on_stderr_at_a_bounded_rate(tmp_path, capsys, monkeypatch):
    write_tree(tmp_path / "tree" / "mydata", per_class=6)
    with tarfile.open(tmp_path / "t.tar", "w") as tar:
        tar.add(tmp_path / "tree" / "mydata", arcname="mydata")
    sha = hashlib.sha256((tmp_path / "t.tar").read_bytes()).hexdigest()
    d = image_cfg(source=str(tmp_path / "t.tar"), sha256=sha, prepared=str(tmp_path / "p"))
    prepare.prepare(d)
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == ""  # stdout stays for results
    # a run this short: only the closing line of each step
    assert len(lines) == 3, lines
    mb = (tmp_path / "t.tar").stat().st_size / 1e6
    assert re.fullmatch(
        rf"\[prepare\] sha256 of {tmp_path / 't.tar'}: {mb:,.0f} of {mb:,.0f} MB "
        r"\(100%\), [\d,]+ MB/s, [\d.]+ s",
        lines[0],
    ), lines
    assert re.fullmatch(
        r"\[prepare\] decoding train: 12 of 12 images \(100%\), [\d,]+ images/s, "
        r"[\d.]+ s",
        lines[1],
    ), lines
    assert lines[2].startswith("[prepare] decoding val: 12 of 12 images (100%)")

    monkeypatch.setattr(sources, "PROGRESS_EVERY_S", 0.0)  # a line per image: k of N, the ETA
    prepare.prepare(image_cfg(source=str(tmp_path / "t.tar"), prepared=str(tmp_path / "q")))
    lines = capsys.readouterr().err.splitlines()
    train = [x for x in lines if "decoding train" in x]
    assert [int(re.search(r": (\d+) of 12", x).group(1)) for x in train] == list(range(1, 13))
    assert re.search(r"\(50%\), [\d,]+ images/s, ETA \d+ s$", train[5]), train


def test_a_truncated_jpeg_is_named_at_prepare_not_in_a_loader_worker(tmp_path):
    """A JPEG cut short (a copy that stopped): its header parses, so PIL's verify() passes
    it; only decoding its data tells. Large images stay files, so this is checked here."""
    write_tree(tmp_path / "tree", per_class=2, size=80)
    jpeg = tmp_path / "tree" / "train" / "dog" / "cut.jpg"
    pixels = np.random.default_rng(1).integers(0, 256, (96, 96, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(jpeg, quality=95)
    jpeg.write_bytes(jpeg.read_bytes()[: jpeg.stat().st_size * 2 // 3])
    Image.open(jpeg).verify()  # what prepare used to check: it passes
    out = tmp_path / "p"
    with pytest.raises(
        sources.DataError, match=f"{jpeg.relative_to(tmp_path / 'tree')}: unreadable"
    ):
        prepare.prepare(image_cfg(source=str(tmp_path / "tree"), prepared=str(out), image_size=72))
    assert not out.exists() and not list(tmp_path.glob(".p.tmp*"))


def test_a_killed_prepares_temporary_folder_is_removed_by_the_next(tmp_path):
    """`kill -9` mid-prepare leaves `.p.tmpPID` behind; the next prepare removes it once
    that pid is gone, and keeps a live process's."""
    write_tree(tmp_path / "tree")
    source = str(tmp_path / "tree")
    code = (
        "import os, sys\n"
        "from abtrain.data import prepare\n"
        "def stop(*a, **k):\n"
        "    os.kill(os.getpid(), 9)\n"
        "prepare._decode_all = stop\n"  # killed while it decodes, its folder half-written
        f"prepare.prepare(prepare.ImageData.model_validate({image_cfg(source=source, prepared=str(tmp_path / 'p')).model_dump()!r}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT)
    assert proc.returncode == -9
    left = list(tmp_path.glob(".p.tmp*"))
    assert len(left) == 1
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = tmp_path / f".p.tmp{other.pid}"  # a live process's: a prepare at work
        live.mkdir()
        prepare.prepare(image_cfg(source=source, prepared=str(tmp_path / "p")))
        assert not left[0].exists() and live.exists()
    finally:
        other.kill()
        other.wait()


# ---------------------------------------------------------------- ImageNet's ReaL labels
def write_imagenet_val(root: Path, size: int = 16) -> list[list[int]]:
    """An ImageNet-like tree: 2 classes x 2 train images, 6 val images named as ImageNet's
    (ILSVRC2012_val_00000001...), and a real.json leaving out images 2 and 5."""
    rng = np.random.default_rng(0)
    for cls in ("n01", "n02"):
        (root / "train" / cls).mkdir(parents=True)
        (root / "val" / cls).mkdir(parents=True)
        for i in range(2):
            Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(
                root / "train" / cls / f"{cls}_{i}.JPEG", format="JPEG"
            )
    for number in range(1, 7):
        cls = "n01" if number <= 3 else "n02"
        pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(
            root / "val" / cls / f"ILSVRC2012_val_{number:08d}.JPEG", format="JPEG"
        )
    return [[0], [], [0, 1], [1], [], [1]]


def real_cfg(tmp_path: Path, real: str | None):
    return image_cfg(
        name="imagenet",
        source=str(tmp_path / "imagenet"),
        prepared=str(tmp_path / "p"),
        real_labels=real,
        image_size=16,
    )


def test_real_labels_leave_out_the_val_images_without_one(tmp_path):
    """The authors' use_real: 4 of 6 val images kept, scored with their original labels."""
    real = write_imagenet_val(tmp_path / "imagenet")
    (tmp_path / "real.json").write_text(json.dumps(real))
    everything = prepare.prepare(real_cfg(tmp_path, None))
    assert everything["counts"]["val"] == {"n01": 3, "n02": 3}
    meta = prepare.prepare(real_cfg(tmp_path, str(tmp_path / "real.json")))
    assert meta["counts"]["val"] == {"n01": 2, "n02": 2}
    assert meta["counts"]["train"] == {"n01": 2, "n02": 2}  # the training set is untouched
    val = torch.load(tmp_path / "p" / "val.pt", weights_only=True)
    assert val["y"].tolist() == [0, 0, 1, 1]  # the folders' labels, not ReaL's


@pytest.mark.parametrize(
    "content,says",
    [
        (None, "does not exist"),
        ("{not json", "not a readable JSON file"),
        (json.dumps({"1": [0]}), "is not ReaL's real.json"),
        (json.dumps([[0], ["a"]]), "is not ReaL's real.json"),
        (json.dumps([[0], [1], [0]]), "has 3 entries; "),
    ],
)
def test_a_missing_or_malformed_real_labels_file_is_named(tmp_path, content, says):
    write_imagenet_val(tmp_path / "imagenet")
    path = tmp_path / "real.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(sources.DataError, match=f"data.real_labels {path}.*{says}"):
        prepare.prepare(real_cfg(tmp_path, str(path)))
    assert not (tmp_path / "p").exists()  # nothing half-written


def test_real_labels_are_for_imagenet_only():
    with pytest.raises(ValueError, match="data.real_labels is for ImageNet"):
        image_cfg(source="tree", real_labels="real.json")


def test_a_killed_prepare_after_an_up_to_date_one_leaves_nothing(tmp_path):
    """A prepare killed mid-way beside a folder already prepared with the same config (a
    second user, a rerun): the next prepare finds the folder up to date and still removes
    the killed one's temporary folder."""
    write_tree(tmp_path / "tree")
    cfg = image_cfg(source=str(tmp_path / "tree"), prepared=str(tmp_path / "p"))
    prepare.prepare(cfg)
    code = (
        "import os\n"
        "from abtrain.data import prepare\n"
        "prepare.fingerprint = lambda d: {'another': 'config'}\n"  # not up to date to it
        "prepare._decode_all = lambda *a, **k: os.kill(os.getpid(), 9)\n"
        f"prepare.prepare(prepare.ImageData.model_validate({cfg.model_dump()!r}))\n"
    )
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == -9
    assert len(list(tmp_path.glob(".p.tmp*"))) == 1
    assert prepare.prepare(cfg)["config"] == prepare.fingerprint(cfg)  # up to date
    assert list(tmp_path.glob(".p.*")) == []


def test_a_record_cut_short_names_the_line_and_column(tmp_path):
    from abtrain.files import RecordError, read_record

    (tmp_path / "r.json").write_text('{"a": "cut')
    with pytest.raises(RecordError) as err:
        read_record(tmp_path / "r.json")
    said = str(err.value)
    assert "(not whole JSON: Unterminated string starting at (line 1, column 7))" in said, said
    assert "at at" not in said
