"""Which edits of params.yaml a stage answers, read by DVC itself on a clone of the
committed repository: `paper_scale` (minutes of CPU) does not rerun for a value that moves
none of its predictions."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import ROOT

BIN = Path(sys.executable).parent


def params_changed(clone: Path, edit) -> set[str]:
    """The params `dvc status paper_scale` calls changed once `edit` changed params.yaml."""
    path = clone / "params.yaml"
    text = path.read_text()
    p = yaml.safe_load(text)
    edit(p["train"])
    path.write_text(yaml.safe_dump(p, sort_keys=False))
    try:
        env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1"}
        run = subprocess.run(
            [str(BIN / "dvc"), "status", "--json", "paper_scale"],
            cwd=clone, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        changed = set()  # {"paper_scale": [{"changed deps": {"params.yaml": {KEY: ...}}}]}
        for entry in json.loads(run.stdout or "{}").get("paper_scale", []):
            if isinstance(entry, dict):
                for deps in entry.values():
                    changed |= set(deps.get("params.yaml", {}))
        return changed
    finally:
        path.write_text(text)


@pytest.mark.pipeline
def test_paper_scale_reruns_for_its_predictions_inputs_only(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--shared", str(ROOT), str(clone)], check=True)

    def searched(t):  # the values a search or a user's -S tunes
        t["optim"]["lr"] = 0.0042
        t["optim"]["weight_decay"] = 0.3
        t["ab"]["sigma_cutoff"] = 0.4
        t["ab"]["lr_rebound_steps"] = 7

    assert params_changed(clone, searched) == set()

    def phases(t):  # AB's phases decide the bytes of each step
        t["ab"]["ab_steps"] += 1

    assert params_changed(clone, phases) == {"train.ab.ab_steps"}
