"""`python -m abtrain ui`: MLflow's web UI over the config's tracking store, with the settings
that let it answer within seconds on a laptop or a 2-core machine, stopped cleanly on Ctrl-C.

`mlflow ui` as it comes starts 4 web workers and about 7 job consumers (~2.4 GB); on 2 cores
its first page took minutes and one consumer outlived Ctrl-C. One web worker and no job
execution (MLflow's server-side jobs, which abtrain does not use) keep it to one process
tree, which Ctrl-C stops as a whole.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

# MLflow's server-side job runner: off (its consumers are most of the processes it starts)
SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
KEY_FIGURES = "viewStateShareKey=key-figures&workflowType=machine_learning"  # tracking.views


def server_command(
    store_uri: str, port: int, host: str = "127.0.0.1", artifacts: Path | None = None
) -> list[str]:
    """`mlflow server` over `store_uri` on `host`:`port` with one web worker (run it with
    SERVER_ENV in its environment)."""
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", store_uri]
    if artifacts is not None:
        cmd += ["--artifacts-destination", str(artifacts)]
    return cmd + ["--host", host, "--port", str(port), "--workers", "1"]


def store_of(args: argparse.Namespace) -> str:
    """The store to serve: --store, else the config's tracking.uri (its default: mlflow.db
    here)."""
    if args.store:
        return args.store
    from abtrain.config import load
    from abtrain.tracking.tracker import default_uri

    return load(args.config, args.overrides).tracking.uri or default_uri()


def run(store_uri: str, port: int, host: str) -> int:
    """Serve until Ctrl-C (or SIGTERM); then stop the server's whole process tree."""
    print(f"[abtrain] MLflow UI over {store_uri}: http://{host}:{port}/", flush=True)
    print(
        f"[abtrain] every run's key figures: http://{host}:{port}/#/experiments/1/runs?"
        f"{KEY_FIGURES} (Ctrl-C stops it)",
        flush=True,
    )
    server = subprocess.Popen(
        server_command(store_uri, port, host),
        env={**os.environ, **SERVER_ENV},
        start_new_session=True,  # its workers in one group, stopped together below
    )
    # SIGINT too: a process started with it ignored (a background job, a test runner's
    # worker) inherits that, and Ctrl-C would then leave the server running
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return server.wait()
    except KeyboardInterrupt:
        stop(server)
        print("[abtrain] MLflow UI stopped", flush=True)
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM (a scheduler, `kill`) stops it as Ctrl-C does


def stop(server: subprocess.Popen, grace: float = 20) -> None:
    """SIGTERM to the server's process group; SIGKILL to what is left of it after `grace` s
    (a worker can outlive its parent)."""
    try:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=grace)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(server.pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    server.wait(timeout=10)
