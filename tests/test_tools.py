"""The team's tools that are not the library: the CPU map of a command (tools/cpu_map.py) and
the sample of every process while it runs (tools/cpu_sample.py)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tools import cpu_map, cpu_sample


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


def test_the_sample_counts_a_process_killed_by_sigkill_and_the_commands_exit_code(tmp_path):
    """What the CPU map cannot see: a process that spins until `kill -9` (as a killed run's
    ranks end) writes nothing at its exit, yet its CPU is in the sample, under its test."""
    spin = "import time\nwhile True: pass  # spun-then-killed"
    script = f"{sys.executable} -c '{spin}' & sleep 2.5; kill -9 $!; wait; exit 3"
    out = tmp_path / "sample.json"
    env = {**os.environ, "PYTEST_CURRENT_TEST": "tests/y.py::killed (call)"}
    code = subprocess.run(
        [sys.executable, "-m", "tools.cpu_sample", "run", str(out), "--", "sh", "-c", script],
        env=env,
        timeout=60,
    ).returncode
    assert code == 3  # the command's own exit code
    procs = json.loads(out.read_text())["processes"]
    (spun,) = [p for p in procs if "spun" in p["cmd"] and p["comm"].startswith("python")]
    assert spun["cpu"] >= 1.0 and spun["test"] == "tests/y.py::killed"
    said = cpu_sample.report(out)
    assert said.splitlines()[1].startswith("idle % by minute: ")
    assert "tests/y.py::killed" in said and "python -c" in said


def test_a_sampler_killed_outright_takes_its_command_with_it(tmp_path):
    pid_file = tmp_path / "pid"
    child = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    cmd = [sys.executable, "-m", "tools.cpu_sample", "run", str(tmp_path / "s.json"), "--"]
    sampler = subprocess.Popen([*cmd, sys.executable, "-c", child])
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the command never started"
        time.sleep(0.1)
    pid = int(pid_file.read_text())
    sampler.kill()
    sampler.wait()
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.1)  # gone, or a zombie no one reaps: either way it works no more
    state = Path(f"/proc/{pid}/stat")
    assert not state.exists() or state.read_text().rsplit(")", 1)[1].split()[0] == "Z"
