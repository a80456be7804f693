"""MLflow for real: a SQLite store read back through MLflow's API, and its UI in Chromium."""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import launch, summary

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """One 2-rank AB run (two groups of one rank) tracked in a fresh SQLite store."""
    d = tmp_path_factory.mktemp("tracked")
    uri = f"sqlite:///{d / 'mlflow.db'}"
    proc = launch(
        d / "run",
        "method=ab",
        "ab.group_size=1",
        "tracking.enabled=true",
        f"tracking.uri={uri}",
        "tracking.required=true",
        "tracking.log_every=3",
        nnodes=1,
        nproc=2,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("abtrain").experiment_id])
    assert len(runs) == 1  # only rank 0 writes
    return d, uri, client, runs[0]


def test_run_logs_params_tags_metrics_and_artifacts(tracked):
    d, _, client, run = tracked
    assert run.info.status == "FINISHED"
    p = run.data.params
    assert p["method"] == "ab" and p["ab.sigma_cutoff"] == "0.15" and p["model.width"] == "64"
    assert p["steps"] == "40" and p["data.name"] == "synthetic"
    t = run.data.tags
    assert t["method"] == "ab" and t["world_size"] == "2" and t["nodes"] == "1"
    assert t["dataset"] == "synthetic" and t["model"] == "mlp" and len(t["git_commit"]) >= 7
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "loss")]
    assert steps == list(range(0, 40, 3))
    phases = {m.value for m in client.get_metric_history(run.info.run_id, "phase")}
    assert phases == {1.0, 2.0, 3.0}  # warm-up, AB, rebound
    evals = client.get_metric_history(run.info.run_id, "val_top1")
    assert len(evals) == len(summary(d / "run")["evals"]) >= 4
    for key in (
        "val_loss",
        "val_top5",
        "train_loss",
        "train_top1",
        "compression_ratio",
        "inter_node_bytes",
        "intra_node_bytes",
        "rank/layers.1",
    ):
        assert client.get_metric_history(run.info.run_id, key), key
    ranks = client.get_metric_history(run.info.run_id, "rank/layers.1")
    assert len(ranks) == len(summary(d / "run")["factorizations"])
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"summary.json", "ledger.jsonl", "config.json", "model.pt"} <= names


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_store_stops_the_run_unless_not_required(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    proc = launch(
        tmp_path / "a",
        "tracking.enabled=true",
        f"tracking.uri={dead}",
        "tracking.required=true",
        "steps=12",
        "method=ddp",
        nnodes=1,
        nproc=2,
    )
    assert proc.returncode != 0
    assert "can't be reached" in proc.stderr and not (tmp_path / "a" / "summary.json").exists()
    proc = launch(
        tmp_path / "b",
        "tracking.enabled=true",
        f"tracking.uri={dead}",
        "tracking.required=false",
        "steps=12",
        "method=ddp",
        nnodes=1,
        nproc=2,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "training on without tracking" in proc.stderr
    assert summary(tmp_path / "b")["steps"] == 12


def test_mlflow_ui_shows_the_run_in_headless_chromium(tracked):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (.ci/run installs it)")
    d, uri, _, run = tracked
    port = free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "ui",
            "--backend-store-uri",
            uri,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2)
                break
            except OSError:
                assert time.monotonic() < deadline, "mlflow ui did not start"
                time.sleep(1)
        shot = d / "mlflow-ui.png"
        page = f"{url}/#/experiments/{run.info.experiment_id}/runs"
        flags = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--virtual-time-budget=30000",
            "--run-all-compositor-stages-before-draw",
            f"--user-data-dir={tempfile.mkdtemp()}",
            "--window-size=1400,900",
        ]
        dom = subprocess.run(
            [chromium, *flags, "--dump-dom", page], capture_output=True, text=True, timeout=120
        ).stdout
        assert run.info.run_name in dom  # the run is listed by name
        subprocess.run(
            [chromium, *flags, f"--screenshot={shot}", page], capture_output=True, timeout=120
        )
        from PIL import Image

        img = Image.open(shot).convert("L")
        assert img.size == (1400, 900)
        lo, hi = img.getextrema()
        assert hi - lo > 100  # a rendered page, not a blank one
        shutil.copy(shot, Path(tempfile.gettempdir()) / "abtrain-mlflow-ui.png")
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)
