"""`python -m bench.X --help` of every bench module: its usage, and nothing run or written
(one of them once ran the planner and overwrote bench/results/paper_scale.json)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest

from tests.helpers import ROOT

MODULES = sorted(p.stem for p in (ROOT / "bench").glob("*.py") if p.stem != "__init__")
WATCHED = ("bench/results", "reports")


def snapshot() -> dict[str, tuple[int, str]]:
    """Every file under the watched folders: its size and a hash of its bytes (not its
    time: other processes may rewrite a report with the same bytes meanwhile)."""
    out = {}
    for top in WATCHED:
        for f in sorted((ROOT / top).rglob("*")):
            if f.is_file():
                data = f.read_bytes()
                out[str(f.relative_to(ROOT))] = (len(data), hashlib.sha256(data).hexdigest())
    return out


# Each module as `python -m bench.NAME --help` runs it (runpy, `sys.argv` as -m sets it),
# one after another in one process: each would import torch again in a process of its own.
HELP_ALL = """
import contextlib, io, json, runpy, sys
said = {}
for name in sys.argv[1:]:
    sys.argv = ["-m", "--help"]
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_module(f"bench.{name}", run_name="__main__", alter_sys=True)
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
    said[name] = (code, out.getvalue(), err.getvalue())
print(json.dumps(said))
"""


@pytest.fixture(scope="module")
def helped() -> dict:
    """Every module's --help."""
    before = snapshot()
    proc = subprocess.run(
        [sys.executable, "-c", HELP_ALL, *MODULES],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(before=before, after=snapshot(), runs=json.loads(proc.stdout))


def test_every_bench_module_is_listed():
    # a new module joins the check by being in bench/
    assert {"network", "rates", "paper_scale", "footprint", "cluster", "table2"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_help_prints_usage(name, helped):
    code, out, err = helped["runs"][name]
    assert code == 0, err[-2000:]
    assert out.startswith("usage:"), out[:500]
    assert "--help" in out


def test_help_writes_nothing(helped):
    before, after = helped["before"], helped["after"]
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, changed
