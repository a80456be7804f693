"""A tracking store lost mid-run, as it happens: a real `mlflow server` process, SIGKILL
after the run's first evaluation, or a SQLite store another process holds locked. With `tracking.required: false` the run trains to the end
and keeps what the server missed; with `true` it stops at its next checkpoint saying why,
and, started again once the server is back, resumes there and sends what it kept."""

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from abtrain.commands.localrun import free_port
from tests.helpers import PARAMS, ROOT, TINY, summary
from tools.mlflow_browser import mlflow_server

pytestmark = pytest.mark.multiprocess

STEPS = 120  # the server dies after the first evaluation (step 20), long before the end


def start_server(store: Path, port: int) -> subprocess.Popen:
    return mlflow_server(f"sqlite:///{store / 'mlflow.db'}", port, store / "artifacts")


def kill(server: subprocess.Popen) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=30)


def train(out: Path, uri: str, required: bool, after_first_eval: Callable[[], None] | None):
    """A 2-node run; `after_first_eval` is called once the run has logged its first
    evaluation (the store's fault). Returns (exit code, stdout, stderr)."""
    cmd = [sys.executable, "-m", "abtrain.launch", "--nnodes=2", "--nproc-per-node=1"]
    cmd += ["train", "--config", str(PARAMS), "--out", str(out)]
    sets = [
        *TINY,
        f"steps={STEPS}",
        "eval_every=20",
        "checkpoint_every=20",
        "method=ab",
        "tracking.enabled=true",
        f"tracking.uri={uri}",
        f"tracking.required={str(required).lower()}",
        "tracking.log_model=false",
    ]
    for s in sets:
        cmd += ["--set", s]
    errors = tempfile.TemporaryFile("w+")  # a pipe left unread could fill and stall the run
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=errors, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout] + [lines.put(None)]).start()
    said, deadline = [], time.time() + 300
    while True:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.time()))
        except queue.Empty:
            proc.kill()
            raise AssertionError("the run did not finish in 300 s:\n" + "".join(said)) from None
        if line is None:
            break
        said.append(line)
        if after_first_eval is not None and "val loss" in line:
            after_first_eval()
            after_first_eval = None
    code = proc.wait(timeout=60)
    errors.seek(0)
    return code, "".join(said), errors.read()


def test_a_lost_server_does_not_stop_a_run_that_does_not_require_it(tmp_path):
    port = free_port()
    server = start_server(tmp_path, port)
    try:
        rc, out, err = train(
            tmp_path / "run", f"http://127.0.0.1:{port}", False, lambda: kill(server)
        )
    finally:
        kill(server)
    assert rc == 0, err[-3000:]
    assert "lost at step" in err and "training on" in err, err[-3000:]
    assert summary(tmp_path / "run")["steps"] == STEPS  # trained to the end, summary written
    kept = (tmp_path / "run" / "mlflow_unsent.jsonl").read_text().splitlines()
    assert any('"final/val_top1_best"' in k for k in kept)  # the end of the run is kept
    assert "mlflow_unsent.jsonl" in err  # and the user is told where
    assert "Traceback" not in err


@pytest.fixture(scope="module")
def stopped_for_its_server(tmp_path_factory):
    """A run that requires its server, the server SIGKILLed after the first evaluation: the
    run stopped (made once; each test below goes on from a copy of it and of the store).
    Returns (folder, port, exit code, stderr)."""
    store = tmp_path_factory.mktemp("stopped")
    port = free_port()
    server = start_server(store, port)
    try:
        rc, _, err = train(store / "run", f"http://127.0.0.1:{port}", True, lambda: kill(server))
    finally:
        kill(server)
    return store, port, rc, err


def copy_of(stopped, tmp_path: Path) -> tuple[int, int, str]:
    """The stopped run and its store, copied to `tmp_path`: (port, exit code, stderr)."""
    store, port, rc, err = stopped
    shutil.copytree(store, tmp_path, dirs_exist_ok=True)
    return port, rc, err


def test_a_run_that_requires_its_server_stops_at_a_checkpoint_and_resumes_when_it_is_back(
    stopped_for_its_server, tmp_path
):
    from mlflow.tracking import MlflowClient

    port, rc, err = copy_of(stopped_for_its_server, tmp_path)
    uri = f"http://127.0.0.1:{port}"
    assert rc == 3  # as the README says: the store was lost, the run stopped whole
    assert "tracking.required is true" in err, err[-6000:]
    last = err.strip().splitlines()[-1]  # the cause, not a peer stopping with it
    assert "tracking.required is true" in last and "without a word" not in last, last
    assert "stopped at the checkpoint of step" in err
    assert not (tmp_path / "run" / "summary.json").exists()
    stopped_at = int((tmp_path / "run" / "checkpoints" / "LATEST").read_text())
    assert 20 <= stopped_at < STEPS
    assert (tmp_path / "run" / "mlflow_unsent.jsonl").exists()

    server = start_server(tmp_path, port)  # back, on the same store
    try:
        rc, out, err = train(tmp_path / "run", uri, True, None)
        assert rc == 0, err[-3000:]
        assert f"resumed from step {stopped_at}" in out
        assert not (tmp_path / "run" / "mlflow_unsent.jsonl").exists()  # sent
        client = MlflowClient(tracking_uri=uri)
        (run,) = client.search_runs(
            [e.experiment_id for e in client.search_experiments()], max_results=5
        )
        assert run.info.status == "FINISHED"
        logged = {m.step for m in client.get_metric_history(run.info.run_id, "val_top1")}
        s = summary(tmp_path / "run")
        assert logged == {e["step"] for e in s["evals"]}  # none missing, the kept ones too
    finally:
        kill(server)


def test_the_advice_a_lost_server_gives_works_when_followed(stopped_for_its_server, tmp_path):
    """The run stops for its lost server and says to resume with `tracking.required=false`;
    resumed so, in the same folder, with the server still gone, it trains to the end."""
    port, rc, err = copy_of(stopped_for_its_server, tmp_path)
    uri = f"http://127.0.0.1:{port}"
    assert rc == 3 and "tracking.required=false" in err, err[-3000:]
    stopped_at = int((tmp_path / "run" / "checkpoints" / "LATEST").read_text())
    rc, out, err = train(tmp_path / "run", uri, False, None)  # the advice, server still gone
    assert rc == 0, err[-3000:]
    assert f"resumed from step {stopped_at}" in out
    assert "resuming with other tracking.required" in out
    assert summary(tmp_path / "run")["steps"] == STEPS


def test_a_required_sqlite_store_held_locked_stops_the_run_and_nothing_is_lost(tmp_path):
    """Another process holds the SQLite store locked from the first evaluation on, past the
    checkpoints: the run stops at one with exit 3 (an artifact written meanwhile does not
    count as the store being back), every value it logged waits in the unsent file. The
    `close` its last line names is refused while the lock holds (nothing changed); once the
    lock is gone it sends them and marks the MLflow run FAILED. Started again, the run
    resumes the same MLflow run and ends it FINISHED."""
    import sqlite3

    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    holder = sqlite3.connect(tmp_path / "mlflow.db", isolation_level=None, timeout=60)
    try:
        rc, out, err = train(tmp_path / "run", uri, True, lambda: holder.execute("BEGIN EXCLUSIVE"))
        assert rc == 3, err[-3000:]
        last = err.strip().splitlines()[-1]
        assert "stopped at the checkpoint of step" in last and "tracking.required is true" in last
        assert f"python -m abtrain close {tmp_path / 'run'}" in last
        kept = (tmp_path / "run" / "mlflow_unsent.jsonl").read_text()
        close = [sys.executable, "-m", "abtrain", "close", str(tmp_path / "run")]
        still = subprocess.run(close, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert still.returncode == 1 and still.stderr.count("\n") == 1, still.stderr[-3000:]
        assert "is not back" in still.stderr and "nothing changed" in still.stderr
        assert (tmp_path / "run" / "mlflow_unsent.jsonl").read_text() == kept
    finally:
        holder.close()
    assert "mlflow.db is back" not in err, err[-3000:]  # no write got through meanwhile
    assert not (tmp_path / "run" / "summary.json").exists()
    assert any('"val_top1"' in k for k in kept.splitlines())
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "RUNNING"  # the store was locked to the end: nothing said yet

    # the lock gone
    closed = subprocess.run(close, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert closed.returncode == 0, closed.stderr[-3000:]
    assert f"marked failed, {len(kept.splitlines())} kept metric values sent" in closed.stdout
    run = client.get_run(run.info.run_id)
    assert run.info.status == "FAILED" and "step" in run.data.tags["abtrain.stopped"]
    assert not (tmp_path / "run" / "mlflow_unsent.jsonl").exists()
    rows = [json.loads(x) for x in kept.splitlines()]
    sent = {m.step for m in client.get_metric_history(run.info.run_id, "val_top1")}
    assert sent >= {r["step"] for r in rows if r["key"] == "val_top1"}

    rc, out, err = train(tmp_path / "run", uri, True, None)  # started again after all
    assert rc == 0, err[-3000:]
    assert not (tmp_path / "run" / "mlflow_unsent.jsonl").exists()
    assert not (tmp_path / "run" / "mlflow_stopped.json").exists()  # no longer one to close
    run = client.get_run(run.info.run_id)
    assert run.info.status == "FINISHED"
    logged = {m.step for m in client.get_metric_history(run.info.run_id, "val_top1")}
    assert logged == {e["step"] for e in summary(tmp_path / "run")["evals"]}
