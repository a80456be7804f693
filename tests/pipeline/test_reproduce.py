"""`python -m pipeline.reproduce` on a clone of the repository whose results stand for a
fresh clone's `dvc repro`: a top-1 moved by 0.05 on another machine passes, the same on the
machine the committed run records is refused, and so is a byte count moved by one."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.pipeline  # the pipeline's own command, in a clone


def git(repo: Path, *args: str) -> None:
    who = ["-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", *who, *args], cwd=repo, check=True, capture_output=True)


def reproduce(repo: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.reproduce"],
        cwd=repo, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def edit(path: Path, change) -> None:
    result = json.loads(path.read_text())
    change(result)
    path.write_text(json.dumps(result, indent=2) + "\n")


def test_the_compare_command_allows_what_another_machine_moves_and_nothing_else(tmp_path):
    repo = tmp_path / "clone"
    git(ROOT, "clone", "-q", "--no-hardlinks", str(ROOT), str(repo))
    results = repo / "results"
    run = reproduce(repo)  # the committed figures themselves
    assert run.returncode == 0, run.stdout + run.stderr
    assert "every run reproduces" in run.stdout
    tol = float(run.stdout.split("within ")[1].split()[0])
    assert 0.05 < tol < 1  # from the committed seed study, not a constant of the command

    def moved(by: float):
        def change(r):
            r["val_top1"]["best"] = round(r["val_top1"]["best"] + by, 2)

        return change

    def elsewhere(r):  # what another CPU's kernels did, on a machine of another record
        moved(0.05)(r)
        r["machine"] = dict(torch="2.14.1", mkl="2024.2", cpu_capability="AVX2", forced={},
                            threads=1, cpu="another CPU")  # fmt: skip

    edit(results / "ab-2x2.json", elsewhere)
    run = reproduce(repo)
    assert run.returncode == 0, run.stderr
    assert "ab-2x2" in run.stdout and "(+0.05)  another machine" in run.stdout

    edit(results / "psgd-2x2.json", lambda r: r["traffic"].update(
        inter_node_bytes=r["traffic"]["inter_node_bytes"] + 1))  # fmt: skip
    run = reproduce(repo)
    assert run.returncode == 1
    assert "[pipeline] differs: psgd-2x2: inter-node bytes" in run.stderr, run.stderr
    assert "ab-2x2" not in run.stderr

    # both runs on one machine's record: the top-1 must be exact
    git(repo, "checkout", "--", "results")
    record = dict(torch="2.14.1", mkl="2024.2", cpu_capability="AVX512", forced={}, threads=1)
    edit(results / "ddp-2x2.json", lambda r: r.update(machine={**record, "cpu": "some CPU"}))
    git(repo, "commit", "-qam", "a run with its machine")
    edit(results / "ddp-2x2.json", moved(0.05))
    run = reproduce(repo)
    assert run.returncode == 1
    assert "ddp-2x2: best top-1" in run.stderr and "the same machine: exact" in run.stderr
