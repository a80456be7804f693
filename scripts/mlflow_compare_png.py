"""docs/mlflow-compare.png: MLflow's compare view of two short real training runs.

    .venv/bin/python scripts/mlflow_compare_png.py [--work DIR] [--steps 48]

Trains ddp and ab (2 nodes x 1 rank, the default profile's data, `--steps` steps) into a
fresh SQLite store in WORK, serves it with `mlflow server`, and screenshots in headless
Chromium the compare view of the two runs (the ML view, not GenAI) into docs/; and, to check
by eye, the runs table in its "Key figures" view into WORK/mlflow-runs.png. Runs already
in WORK are reused. Needs Debian's chromium.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from abtrain.files import atomic_write_bytes  # noqa: E402
from abtrain.mlflow_ui import key_figures_link  # noqa: E402


def train(work: Path, method: str, steps: int) -> None:
    """One short run of the default profile (its data, model and optimiser), tracked."""
    out = work / method
    if (out / "summary.json").exists():
        return
    sets = [
        f"method={method}",
        f"steps={steps}",
        f"eval_every={steps // 3}",
        "checkpoint_every=0",
        f"ab.warmup_steps={steps // 3}",
        f"ab.ab_steps={steps // 4}",
        f"ab.rebound_steps={steps // 12}",
        f"ab.lr_rebound_steps={steps // 12}",
        "data.workers=1",
        f"tracking.uri=sqlite:///{work / 'mlflow.db'}",
    ]
    cmd = [sys.executable, "-m", "abtrain.launch", "--nnodes=2", "--nproc-per-node=1"]
    cmd += ["train", "--config", str(ROOT / "params.yaml"), "--out", str(out)]
    cmd += sum((["--set", s] for s in sets), [])
    subprocess.run(cmd, cwd=ROOT, check=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(store: str, port: int) -> subprocess.Popen:
    """`mlflow server` on 127.0.0.1:port, once it answers /health."""
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", store]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    server = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return server
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                os.killpg(server.pid, 15)
                raise SystemExit(f"mlflow server over {store} did not answer in 120 s") from None
            time.sleep(0.5)


def screenshot(chromium: str, page: str, path: Path, height: int) -> None:
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--virtual-time-budget=30000",
        "--run-all-compositor-stages-before-draw",
        f"--user-data-dir={tempfile.mkdtemp()}",
        f"--window-size=1400,{height}",
        f"--screenshot={path}",
    ]
    subprocess.run([chromium, *flags, page], capture_output=True, timeout=180, check=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "abtrain-mlflow")
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "mlflow-compare.png")
    args = ap.parse_args(argv)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("chromium is not installed (apt-get install chromium)")
    args.work.mkdir(parents=True, exist_ok=True)
    for method in ("ddp", "ab"):
        train(args.work, method, args.steps)
    from mlflow.tracking import MlflowClient

    store = f"sqlite:///{args.work / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=store)
    exp = client.get_experiment_by_name("abtrain").experiment_id
    ids = []
    for method in ("ddp", "ab"):  # each run's tags name its folder
        out = (args.work / method).resolve()
        (run,) = client.search_runs([exp], f"tags.out_dir = '{out}'", max_results=1)
        ids.append(run.info.run_id)
    port = free_port()
    server = serve(store, port)
    try:
        url = f"http://127.0.0.1:{port}/"
        query = urllib.parse.urlencode(
            {"runs": json.dumps(ids), "experiments": json.dumps([exp])},
            quote_via=urllib.parse.quote,
        )
        shot = args.work / "mlflow-compare.png"
        screenshot(
            chromium, f"{url}#/compare-runs?{query}&workflowType=machine_learning", shot, 2100
        )
        atomic_write_bytes(args.out, shot.read_bytes())
        screenshot(chromium, url + key_figures_link(exp), args.work / "mlflow-runs.png", 900)
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)
    print(f"wrote {args.out} and {args.work / 'mlflow-runs.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
