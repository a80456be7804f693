"""Damaged data as it happens in the field: a prepared split emptied on disk, a class folder
removed from an ImageFolder source, an image truncated to nothing. Each is named in one line
before any rank starts (no run folder left), and `prepare` repairs what it wrote."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.abtrain.test_data import write_colour_tree, write_tree
from tests.helpers import PARAMS, ROOT, TINY, launch

pytestmark = pytest.mark.multiprocess  # the launcher's refusal, as a user meets it


def data_set(tmp_path: Path, source: Path, size: int) -> str:
    return (
        f"data={{name: imagefolder, source: {source}, sha256: null, "
        f"prepared: {tmp_path / 'prepared'}, train_per_class: 0, val_per_class: 0, "
        f"real_labels: null, image_size: {size}, augment: false, workers: 0}}"
    )


def prepare(data: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "abtrain", "prepare", "--config", str(PARAMS), "--set", data]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def train(tmp_path: Path, data: str) -> subprocess.CompletedProcess:
    return launch(
        tmp_path / "run", data, "model={name: timm, arch: resnet10t}", "batch_size=4",
        "steps=4", "eval_every=4", "checkpoint_every=0", "ab.warmup_steps=2",
        "ab.ab_steps=1", "ab.rebound_steps=1", nnodes=2, nproc=1,
    )  # fmt: skip


def refused_in_one_line(proc: subprocess.CompletedProcess, tmp_path: Path, *words: str) -> str:
    assert proc.returncode == 2, proc.stderr[-3000:]
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1, err
    for w in words:
        assert w in err, err
    assert not (tmp_path / "run").exists()  # refused before anything was written
    return err


def test_a_prepared_split_emptied_on_disk_is_named_and_prepare_repairs_it(tmp_path):
    write_tree(tmp_path / "tree", per_class=6, size=32)
    data = data_set(tmp_path, tmp_path / "tree", 32)
    assert prepare(data).returncode == 0
    val = tmp_path / "prepared" / "val.pt"
    whole = val.read_bytes()
    val.write_bytes(b"")  # as `: > val.pt` leaves it
    err = refused_in_one_line(train(tmp_path, data), tmp_path, str(val), "0 bytes")
    assert "python -m abtrain prepare" in err
    again = prepare(data)  # not "prepared" as it is: prepared again
    assert again.returncode == 0, again.stderr
    assert f"{val} is damaged" in again.stdout and "preparing it again" in again.stdout
    assert val.read_bytes() == whole
    # one byte flipped, the size kept: the checksum tells
    flipped = bytearray(whole)
    flipped[len(flipped) // 2] ^= 0xFF
    val.write_bytes(bytes(flipped))
    refused_in_one_line(train(tmp_path, data), tmp_path, str(val), "sha256")
    assert "preparing it again" in prepare(data).stdout and val.read_bytes() == whole


def test_a_source_folder_losing_a_class_or_an_image_is_named_before_any_rank_trains(tmp_path):
    """Large images stay in the source folder (an index of files): what changed there since
    prepare is named at start, not by a DataLoader worker mid-run."""
    write_colour_tree(tmp_path / "tree")
    data = data_set(tmp_path, tmp_path / "tree", 72)
    assert prepare(data).returncode == 0
    assert "files" in json.loads((tmp_path / "prepared" / "meta.json").read_text())
    jpeg = tmp_path / "tree" / "train" / "bee" / "n0001.JPEG"
    blob = jpeg.read_bytes()
    jpeg.write_bytes(b"")  # a zero-byte image
    refused_in_one_line(train(tmp_path, data), tmp_path, str(jpeg), "0 bytes")
    jpeg.write_bytes(blob)
    shutil.rmtree(tmp_path / "tree" / "val" / "cow")  # a class folder removed
    err = refused_in_one_line(train(tmp_path, data), tmp_path, "missing", "4 of the 12 images")
    assert str(tmp_path / "tree" / "val" / "cow") in err


def test_the_same_refusal_from_check_names_it_too(tmp_path, capsys):
    from abtrain.__main__ import main

    write_tree(tmp_path / "tree", per_class=6, size=32)
    data = data_set(tmp_path, tmp_path / "tree", 32)
    assert prepare(data).returncode == 0
    (tmp_path / "prepared" / "train.pt").write_bytes(b"")
    args = ["check", "--config", str(PARAMS)]
    for o in (*TINY, data, "model={name: timm, arch: resnet10t}", "batch_size=4"):
        args += ["--set", o]
    assert main(args) == 2
    assert "train.pt is damaged" in capsys.readouterr().err
