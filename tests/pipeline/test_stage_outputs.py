"""What DVC may delete: no output of any stage, committed or not, is removed before its stage
runs (a stage that fails would leave none); the failure itself, through `dvc exp run`, is
tests/pipeline/test_pipeline.py's."""

import pytest
import yaml

from tests.helpers import ROOT, processes


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


@pytest.mark.pipeline
def test_a_stage_dies_with_the_dvc_that_ran_it_through_a_shell(tmp_path):
    """DVC runs a stage as `$SHELL -c CMD`, `/bin/sh` where $SHELL is unset (CI, a batch
    job); dash stays as the stage's parent and lives on when DVC is killed with -9. The stage
    must end anyway, not train on with no DVC to record it."""
    import os
    import shlex
    import signal
    import subprocess
    import sys
    import time

    pid_file = tmp_path / "stage.pid"
    stage = (
        "import os, time; from pipeline.stage import stage; "
        f"stage(lambda: open({str(pid_file)!r}, 'w').write(str(os.getpid())) and time.sleep(300))"
    )
    # the runner stands in for dvc: it runs the command as DVC's `_run` does, then waits
    runner = "import subprocess, sys; subprocess.Popen(['/bin/sh', '-c', sys.argv[1] + ' ']).wait()"
    cmd = f"{sys.executable} -c {shlex.quote(stage)}"
    env = {**os.environ, "DVC_STAGE": "train@x", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", runner, cmd], cwd=ROOT, env=env)
    try:
        deadline = time.monotonic() + 120
        while not (pid_file.exists() and pid_file.read_text()):
            assert time.monotonic() < deadline and proc.poll() is None, "the stage never started"
            time.sleep(0.1)
        pid = int(pid_file.read_text())
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while pid in processes():
            assert time.monotonic() < deadline, "the stage lives 10 s after its DVC was killed"
            time.sleep(0.1)
    finally:
        proc.kill()


def test_ctrl_c_says_what_is_left_a_stage_nothing_a_study_what_finished(capsys):
    """A stage stopped by Ctrl-C records nothing (DVC keeps the last outputs); a study
    (`python -m bench.tradeoff`, `bench.lengths`) keeps every search and run that finished,
    and its line says so rather than the stage's (the length study's, through Ctrl-C at a
    terminal: tests/bench/test_lengths.py)."""
    from pipeline.stage import STUDY_STOPPED, stage

    def interrupted() -> int:
        raise KeyboardInterrupt

    assert stage(interrupted) == 130
    assert capsys.readouterr().err == (
        "[pipeline] stopped (Ctrl-C); nothing of this stage was recorded\n"
    )
    assert stage(interrupted, who="bench.tradeoff", stopped=STUDY_STOPPED) == 130
    assert capsys.readouterr().err == (
        "[bench.tradeoff] stopped (Ctrl-C); what finished is kept, and the same command goes "
        "on from there\n"
    )
