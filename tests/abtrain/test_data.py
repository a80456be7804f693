import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from abtrain import config, data
from tests.conftest import ROOT, tiny_config

SHARED_CIFAR = ROOT.parent / "shared" / "data" / "cifar10-jpg.tar.gz"


def image_cfg(**fields):
    d = dict(
        name="imagefolder",
        source=None,
        sha256=None,
        prepared="",
        train_per_class=0,
        val_per_class=0,
        image_size=32,
        augment=True,
        workers=2,
    )
    d.update(fields)
    return config.ImageData(**d)


# ---------------------------------------------------------------- CIFAR python batches
def write_cifar(root: Path, name: str = "cifar10", per_batch: int = 20, seed: int = 0) -> dict:
    """The original python-version layout, with random pixels; returns what was written."""
    rng = np.random.default_rng(seed)
    spec = data.CIFAR[name]
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
    meta = data.prepare(d)
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
    )
    meta = data.prepare(d)
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
    meta = data.prepare(d)
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
        f"prepared: {tmp_path / 'p'}, train_per_class: 0, val_per_class: 0, image_size: 72, "
        "augment: true, workers: 2}",
    )
    meta = data.prepare(cfg.data)
    assert not meta["cached"] and (tmp_path / "p" / "files").is_dir()
    task = data.make_task(cfg)
    sampler = data.StepSampler(len(task), 2, rank=1, world_size=2, seed=0)
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
        sha256="7854ea059adc7729ab5267c5269ccc01e6eaeea6549d5f3c834c106bae86e8ee",
    )
    meta = data.prepare(d)
    assert meta["classes"][:3] == ["airplane", "automobile", "bird"] and len(meta["classes"]) == 10
    assert set(meta["counts"]["train"].values()) == {50} and set(
        meta["counts"]["val"].values()
    ) == {10}
    assert meta["mean"] == pytest.approx([0.49, 0.48, 0.45], abs=0.05)


def test_cifar_augmentation_pads_crops_and_flips_deterministically():
    x = torch.arange(2 * 3 * 8 * 8, dtype=torch.uint8).view(2, 3, 8, 8)
    a = data._augment(x, torch.Generator().manual_seed(1))
    b = data._augment(x, torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and a.shape == x.shape


def test_step_sampler_ranks_together_see_the_single_process_batch():
    single = data.StepSampler(100, 8, 0, 1, seed=3)
    for step in (0, 5, 12, 13):  # 12 steps per epoch: 13 is in the next epoch
        parts = [data.StepSampler(100, 2, r, 4, seed=3).indices(step) for r in range(4)]
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
    ],
)
def test_prepare_rejects_bad_trees_naming_the_path_and_leaves_nothing(tmp_path, make, expect):
    root = tmp_path / "tree"
    make(root)
    out = tmp_path / "p"
    with pytest.raises(data.DataError, match=expect) as err:
        data.prepare(image_cfg(source=str(root), prepared=str(out)))
    assert str(root) in str(err.value)
    assert not out.exists() and not list(tmp_path.glob(".p.tmp*"))


def test_prepare_rejects_a_wrong_checksum(tmp_path):
    write_tree(tmp_path / "tree")
    with tarfile.open(tmp_path / "t.tar", "w") as tar:
        tar.add(tmp_path / "tree", arcname="t")
    with pytest.raises(data.DataError, match=r"t\.tar: sha256 does not match"):
        data.prepare(
            image_cfg(source=str(tmp_path / "t.tar"), sha256="0" * 64, prepared=str(tmp_path / "p"))
        )
    fake = tmp_path / "cifar-10-python.tar.gz"  # CIFAR's own archive name: md5 is checked
    fake.write_bytes(b"x" * 100)
    with pytest.raises(data.DataError, match="md5 does not match the published cifar10"):
        data.prepare(image_cfg(name="cifar10", source=str(fake), prepared=str(tmp_path / "p")))
    assert not (tmp_path / "p").exists()


def test_prepare_rejects_a_broken_cifar_batch(tmp_path):
    write_cifar(tmp_path / "src")
    (tmp_path / "src" / "cifar-10-batches-py" / "data_batch_3").write_bytes(b"garbage")
    with pytest.raises(data.DataError, match="data_batch_3: not a CIFAR python batch"):
        data.prepare(
            image_cfg(name="cifar10", source=str(tmp_path / "src"), prepared=str(tmp_path / "p"))
        )


def test_unknown_data_set_name_is_a_config_error():
    with pytest.raises(config.ConfigError, match=r"data"):
        tiny_config("data={name: mnist, source: x}")


def test_training_refuses_unprepared_or_stale_data(tmp_path):
    cfg = tiny_config(
        f"data={{name: imagefolder, source: {tmp_path}, sha256: null, prepared: {tmp_path / 'p'}, "
        "train_per_class: 0, val_per_class: 0, image_size: 32, augment: true, workers: 1}"
    )
    with pytest.raises(data.DataError, match="is not prepared"):
        data.make_task(cfg)
    write_tree(tmp_path)
    data.prepare(cfg.data)
    data.make_task(cfg)
    stale = cfg.model_copy(update={"data": cfg.data.model_copy(update={"train_per_class": 1})})
    with pytest.raises(data.DataError, match="another data config"):
        data.make_task(stale)
