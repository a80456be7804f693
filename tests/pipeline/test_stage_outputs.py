"""What DVC may delete: no output of any stage, committed or not, is removed before its stage
runs (a stage that fails would leave none); the failure itself, through `dvc exp run`, is
tests/pipeline/test_pipeline.py's."""

import pytest
import yaml

from tests.helpers import ROOT


def outputs(stage: dict) -> list[tuple[str, dict]]:
    found = []
    for kind in ("outs", "metrics", "plots"):
        for item in stage.get(kind, []):
            path, opts = next(iter(item.items())) if isinstance(item, dict) else (item, {})
            found.append((path, opts or {}))
    return found


def test_every_output_persists_and_lives_in_git():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    seen = 0
    for name, stage in stages.items():
        for path, opts in outputs(stage.get("do", stage)):
            assert opts.get("persist") is True, f"{name}: {path} is deleted before the stage runs"
            assert opts.get("cache") is False, f"{name}: {path}"
            seen += 1
    assert seen >= 17


@pytest.mark.pipeline
def test_ctrl_c_while_a_stage_starts_ends_it_in_one_line():
    """Ctrl-C in the seconds a DVC stage spends importing torch: one line and 130, not a
    traceback through the import machinery."""
    import os
    import signal
    import subprocess
    import sys
    import time

    env = {**os.environ, "DVC_STAGE": "train@ab-2x2"}  # as DVC runs a stage's command
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline.train", "ab-2x2"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(0.3)  # while it imports (or, on a fast machine, just after: either way)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert err.strip().splitlines() in (
        ["[pipeline] stopped (Ctrl-C) as the stage started; nothing of it was recorded"],
        ["[pipeline] stopped (Ctrl-C); nothing of this stage was recorded"],
    ), err
