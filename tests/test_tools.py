"""The team's tools that are not the library: the CPU map of a command (tools/cpu_map.py)."""

import os
import subprocess
import sys

from tools import cpu_map


def test_the_cpu_map_logs_each_python_process_and_whether_it_imported_torch(tmp_path):
    venv = tmp_path / "venv"
    site = venv / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    log = tmp_path / "cpu.log"
    hook = cpu_map.install(venv, log)
    env = {**os.environ, "PYTHONPATH": str(site), "PYTEST_CURRENT_TEST": "tests/x.py::t (call)"}
    for code in ("import torch", "sum(range(10**6))"):
        subprocess.run([sys.executable, "-c", code], env=env, check=True)
    rows = [line.split("\t") for line in log.read_text().splitlines()]
    assert [(r[1], r[2]) for r in rows] == [
        ("True", "tests/x.py::t (call)"),
        ("False", "tests/x.py::t (call)"),
    ]
    assert float(rows[0][0]) > 0
    said = cpu_map.report(log)
    assert said.startswith("2 processes, ") and "; 1 imported torch and spent " in said
    assert "tests/x.py::t" in said and "(call)" not in said
    cpu_map.uninstall(venv)
    assert not hook.exists()
