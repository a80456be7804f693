"""`python -m abtrain ui` as a user starts it: MLflow's UI over the config's store answers,
and Ctrl-C stops it with every process it started."""

import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from abtrain.commands.localrun import free_port
from tests.helpers import PARAMS, ROOT, processes

# A guard against the 4 minutes `mlflow ui` took to its first page here with its defaults,
# not a speed target (one web worker answers in seconds)
FIRST_ANSWER_S = 90


@pytest.mark.slow
def test_the_ui_answers_and_ctrl_c_stops_it_and_all_it_started(tmp_path):
    port = free_port()
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # the command each run prints: `python -m abtrain ui --store URI`
    cmd = [sys.executable, "-m", "abtrain", "ui", "--store", store, "--port", str(port)]
    ui = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started: set[int] = set()
    try:
        deadline = time.monotonic() + FIRST_ANSWER_S
        while True:
            try:
                page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).read()
                break
            except OSError:
                assert ui.poll() is None, ui.communicate()
                assert time.monotonic() < deadline, "no answer"
                time.sleep(0.5)
        assert b"<html" in page.lower()
        tree = processes()
        started = {pid for pid, p in tree.items() if tree.get(p.parent, p).parent == ui.pid}
        started |= {pid for pid, p in tree.items() if p.parent == ui.pid}
        sessions = {tree[pid].session for pid in started}
        assert started and len(sessions) == 1  # the server and its worker, one session
        ui.send_signal(signal.SIGINT)  # Ctrl-C
        out, err = ui.communicate(timeout=60)
        assert ui.returncode == 0, err
        assert f"http://127.0.0.1:{port}/" in out and "stopped" in out
        left = [p.command for p in processes().values() if p.session in sessions]
        assert left == [], left
    finally:
        ui.kill()
        for pid in started & set(processes()):
            subprocess.run(["kill", "-9", str(pid)], check=False)


def test_the_store_is_the_configs_unless_one_is_given(tmp_path, capsys):
    from abtrain.__main__ import main
    from abtrain.commands import ui
    from abtrain.commands.cli import build_parser

    store = f"sqlite:///{tmp_path / 'x.db'}"
    args = build_parser().parse_args(["ui", "--config", str(PARAMS)])
    assert ui.store_of(args) == f"sqlite:///{ROOT / 'mlflow.db'}".replace(
        str(ROOT), str(Path.cwd())
    )
    args = build_parser().parse_args(["ui", "--set", f"tracking.uri={store}"])
    assert ui.store_of(args) == store
    args = build_parser().parse_args(["ui", "--store", "sqlite:///y.db", "--config", "none.yaml"])
    assert ui.store_of(args) == "sqlite:///y.db"  # the config is not read
    assert main(["ui", "--config", str(tmp_path / "none.yaml")]) == 2
    assert "none.yaml" in capsys.readouterr().err
