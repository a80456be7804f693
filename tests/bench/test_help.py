"""`python -m bench.X --help` of every bench module: its usage, and nothing run or written
(one of them once ran the planner and overwrote bench/results/paper_scale.json)."""

from __future__ import annotations

import hashlib
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


@pytest.fixture(scope="module")
def helped() -> dict:
    """Every module's --help, all at once (each imports torch: one at a time is slow)."""
    before = snapshot()
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", f"bench.{name}", "--help"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in MODULES
    }
    done = {}
    for name, p in procs.items():
        out, err = p.communicate(timeout=300)
        done[name] = (p.returncode, out, err)
    return dict(before=before, after=snapshot(), runs=done)


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
