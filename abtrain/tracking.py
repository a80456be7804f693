"""MLflow tracking, from rank 0 only.

The default store is SQLite in the working directory (`sqlite:///mlflow.db`, artifacts in
`mlartifacts/` beside it); any tracking URI can be set instead (a server, on a cluster).
A store that can't be reached stops the run at start-up, or, with `tracking.required:
false`, is reported once and the run trains on with its summary on disk only.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from abtrain.config import Config


class TrackingError(RuntimeError):
    pass


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def default_uri() -> str:
    return f"sqlite:///{Path.cwd() / 'mlflow.db'}"


class Tracker:
    """Does nothing unless `active`; every method is safe to call on any rank."""

    def __init__(self, cfg: Config, active: bool) -> None:
        self.client = None
        self.run_id: str | None = None
        self._buffer: list[Any] = []
        if not active:
            return
        uri = cfg.tracking.uri or default_uri()
        # fail fast on a server that isn't there, instead of minutes of retries
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        from mlflow.tracking import MlflowClient

        try:
            client = MlflowClient(tracking_uri=uri)
            exp = client.get_experiment_by_name(cfg.tracking.experiment)
            if exp is None:
                location = None
                if uri.startswith("sqlite:///"):
                    location = (Path(uri[len("sqlite:///") :]).parent / "mlartifacts").as_uri()
                self.experiment_id = client.create_experiment(
                    cfg.tracking.experiment, artifact_location=location
                )
            else:
                self.experiment_id = exp.experiment_id
        except Exception as err:
            msg = f"tracking store {uri} can't be reached: {type(err).__name__}: {err}"
            if cfg.tracking.required:
                raise TrackingError(
                    msg + " (set tracking.required: false to train without it)"
                ) from None
            print(f"[abtrain] warning: {msg}; training on without tracking", file=sys.stderr)
            return
        self.client, self.uri = client, uri

    def start(self, cfg: Config, tags: dict[str, Any], run_id: str | None, name: str) -> None:
        """Open the run (or reopen it on resume) and log the config as params."""
        if self.client is None:
            return
        from mlflow.entities import Param

        if run_id is not None:
            self.run_id = run_id
            self.client.update_run(run_id, status="RUNNING")
            return
        run = self.client.create_run(
            self.experiment_id, run_name=name, tags={k: str(v) for k, v in tags.items()}
        )
        self.run_id = run.info.run_id
        params = [Param(k, str(v)) for k, v in flatten(cfg.dump()).items()]
        for i in range(0, len(params), 100):
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    def metrics(self, step: int, values: dict[str, float]) -> None:
        if self.client is None:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._buffer += [Metric(k, float(v), now, step) for k, v in values.items()]
        if len(self._buffer) >= 500:
            self.flush()

    def flush(self) -> None:
        if self.client is None or not self._buffer:
            return
        for i in range(0, len(self._buffer), 1000):
            self.client.log_batch(self.run_id, metrics=self._buffer[i : i + 1000])
        self._buffer = []

    def artifacts(self, paths: list[Path]) -> None:
        if self.client is None:
            return
        for p in paths:
            if p.exists():
                self.client.log_artifact(self.run_id, str(p))

    def finish(self, status: str) -> None:
        if self.client is None or self.run_id is None:
            return
        self.flush()
        self.client.set_terminated(self.run_id, status=status)
