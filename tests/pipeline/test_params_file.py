"""params.yaml as `dvc exp run -S` leaves it: DVC rewrites the file through ruamel, so the
committed files are kept in the form DVC writes, and a value set with -S changes only its
own line."""

from __future__ import annotations

import difflib
import shutil
from pathlib import Path

import pytest
import yaml

from pipeline.slurm import checked

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["params.yaml", "profiles/paper.yaml", "profiles/table2.yaml"])
def test_each_params_file_is_what_dvc_writes_back(tmp_path, name):
    """DVC's own code for `dvc exp run -S` (hydra's overrides, then a ruamel round trip that
    replaces every list): a value set to what it is leaves the file byte for byte, and a
    value set anew changes its own line alone. (tests/pipeline/test_pipeline.py runs `dvc
    exp run -S` itself.)"""
    from dvc.utils.hydra import apply_overrides

    path = tmp_path / "params.yaml"
    shutil.copy(ROOT / name, path)
    before = path.read_text()
    seed = yaml.safe_load(before)["train"]["seed"]
    apply_overrides(str(path), [f"train.seed={seed}"])
    assert path.read_text() == before, "\n".join(
        difflib.unified_diff(before.splitlines(), path.read_text().splitlines(), lineterm="")
    )
    apply_overrides(str(path), [f"train.seed={seed + 7}"])
    changed = [
        line
        for line in difflib.unified_diff(before.splitlines(), path.read_text().splitlines(), n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    assert [c.split("#")[0].strip() for c in changed] == [
        f"-  seed: {seed}",
        f"+  seed: {seed + 7}",
    ]


def test_a_slurm_time_read_as_a_number_is_refused_naming_the_key():
    value = yaml.safe_load("time: 12:00:00")["time"]  # what an unquoted H:MM:SS becomes
    assert value == 43200
    with pytest.raises(ValueError, match=r"experiments\.slurm\.time: 43200 was read as a number"):
        checked({"time": value}, "ab-2x2")
    assert checked({"time": "0-00:30:00"}, "ab-2x2")["time"] == "0-00:30:00"
