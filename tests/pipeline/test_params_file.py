"""params.yaml as `dvc exp run -S` leaves it: DVC rewrites the file through ruamel, so the
committed file is kept in the form ruamel writes, and a value set with -S changes only
its own lines."""

from __future__ import annotations

import difflib
import shutil
from pathlib import Path

import pytest
import yaml
from dvc.utils.serialize import modify_yaml

from pipeline.slurm import checked

ROOT = Path(__file__).resolve().parents[2]


def test_dvc_set_param_changes_only_the_lines_of_the_value_it_sets(tmp_path):
    path = tmp_path / "params.yaml"
    shutil.copy(ROOT / "params.yaml", path)
    before = path.read_text().splitlines()
    with modify_yaml(path) as d:  # what `dvc exp run -S 'experiments.set=[...]'` does
        d["experiments"]["set"] = ["optim.lr=0.001"]
    after = path.read_text().splitlines()
    changed = [
        line
        for line in difflib.unified_diff(before, after, lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    assert [line[:1] for line in changed] == ["-", "+", "+"], changed
    assert changed[0].startswith("-  set: []") and changed[1].startswith("+  set:")
    assert changed[2] == "+  - optim.lr=0.001"
    # and the values are the same as the committed file's but for that one
    old, new = yaml.safe_load("\n".join(before)), yaml.safe_load("\n".join(after))
    new["experiments"]["set"] = []
    assert old == new


def test_a_slurm_time_read_as_a_number_is_refused_naming_the_key():
    value = yaml.safe_load("time: 12:00:00")["time"]  # what an unquoted H:MM:SS becomes
    assert value == 43200
    with pytest.raises(ValueError, match=r"experiments\.slurm\.time: 43200 was read as a number"):
        checked({"time": value}, "ab-2x2")
    assert checked({"time": "0-00:30:00"}, "ab-2x2")["time"] == "0-00:30:00"
