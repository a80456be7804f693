"""The train stage's script (`python -m pipeline.train NAME`) as DVC runs it, in a folder of
its own: a run of the matrix at several seeds (experiments.seeds)."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from abtrain import config
from tests.helpers import PARAMS, ROOT, TINY


@pytest.mark.pipeline
@pytest.mark.multiprocess
def test_the_train_stage_trains_every_seed_and_writes_their_mean(tmp_path):
    p = yaml.safe_load(PARAMS.read_text())
    p["train"] = config.apply_overrides(p["train"], TINY)
    p["search"]["use_best"] = []
    e = p["experiments"]
    e.update(seeds=2, epochs=0.32, evaluations=4, set=[])  # 2000 samples / 16: 40 steps
    e["runs"] = {"ddp-1x1": dict(method="ddp", nodes=1, ranks_per_node=1, batch="local")}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(p))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def stage(module: str = "pipeline.train", *args: str):
        return subprocess.run(
            [sys.executable, "-m", module, *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    resolved = stage("pipeline.resolve")  # as dvc repro does before any run
    assert resolved.returncode == 0, resolved.stderr[-3000:]
    proc = stage("pipeline.train", "ddp-1x1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "seed 1 (2 of 2)" in proc.stdout
    result = json.loads((tmp_path / "results" / "ddp-1x1.json").read_text())
    bests = [s["val_top1"]["best"] for s in result["seeds"]]
    assert [s["seed"] for s in result["seeds"]] == [0, 1] and bests[0] != bests[1]
    assert result["val_top1"]["best"] == pytest.approx(sum(bests) / 2)
    second = tmp_path / "runs" / "train" / "ddp-1x1" / "seeds" / "1"
    assert json.loads((second / "config.json").read_text())["seed"] == 1
    before = (second / "summary.json").stat().st_mtime_ns
    assert (
        stage("pipeline.train", "ddp-1x1").returncode == 0
    )  # both seeds finished: nothing is retrained
    assert (second / "summary.json").stat().st_mtime_ns == before
