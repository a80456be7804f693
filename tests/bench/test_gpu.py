"""bench.gpu on a machine without a GPU: it says so, and still writes its JSON."""

import json
import os
import subprocess
import sys

from tests.helpers import ROOT


def test_without_a_gpu_it_says_so_and_exits_0(tmp_path):
    out = tmp_path / "gpu.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.gpu", "--out", str(out)],
        cwd=ROOT,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},  # no GPU, even on a machine with one
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "no CUDA GPU" in proc.stderr
    result = json.loads(out.read_text())
    assert result["gpu"] is False and "no CUDA GPU" in result["reason"]
