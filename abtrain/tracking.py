"""MLflow tracking, from rank 0 only.

The default store is SQLite in the working directory (`sqlite:///mlflow.db`, artifacts in
`mlartifacts/` beside it); any tracking URI can be set instead (a server, on a cluster).
A store that can't be reached stops the run at start-up, or, with `tracking.required:
false`, is reported once and the run trains on with its summary on disk only.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from abtrain.config import Config

ARTIFACTS_DIR = "mlartifacts"
# MLflow 3 opens an experiment without this tag on its GenAI overview (traces, prompts); with
# it, on the runs table. The UI's own "custom model development" choice writes this value.
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
SYSTEM_METRICS_INTERVAL_S = 10  # MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL overrides it


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


def artifact_location(uri: str) -> str | None:
    """`mlartifacts/` beside a SQLite file; None (the store's own choice) for any other URI.

    Without it MLflow puts a SQLite store's artifacts in `./mlruns`, wherever the process
    happens to run.
    """
    if not uri.startswith("sqlite:///"):
        return None
    return (Path(uri[len("sqlite:///") :]).resolve().parent / ARTIFACTS_DIR).as_uri()


def experiment_id(client: Any, name: str, uri: str) -> str:
    """The experiment `name`, created with the artifact location above if it is new, and
    marked as one of training runs (new or not) so the UI opens on its runs table."""
    exp = client.get_experiment_by_name(name)
    if exp is None:
        return client.create_experiment(
            name, artifact_location=artifact_location(uri), tags=dict([EXPERIMENT_KIND])
        )
    if EXPERIMENT_KIND[0] not in exp.tags:
        client.set_experiment_tag(exp.experiment_id, *EXPERIMENT_KIND)
    return exp.experiment_id


def run_name_for(cfg: Config, nodes: int, ranks_per_node: int) -> str:
    """`tracking.run_name`, or one that tells the points of the experiment matrix apart:
    method, model, data, nodes x ranks per node and the batch per rank."""
    return cfg.tracking.run_name or (
        f"{cfg.method}-{cfg.model.name}-{cfg.data.name}-{nodes}x{ranks_per_node}-b{cfg.batch_size}"
    )


def source_tags(commit: str) -> dict[str, str]:
    """MLflow's standard tags: what ran, from which commit, started by whom and how."""
    tags = {
        "mlflow.source.name": "python -m abtrain train",
        "mlflow.source.type": "JOB" if os.environ.get("SLURM_JOB_ID") else "LOCAL",
        "mlflow.source.git.commit": commit,
    }
    try:
        tags["mlflow.user"] = getpass.getuser()
    except (KeyError, OSError):  # a container's uid without a passwd entry
        pass
    return tags


def dataset_digest(description: dict[str, Any]) -> str:
    """A short, stable hash of a JSON-able description (MLflow keeps 36 characters)."""
    text = json.dumps(description, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class Tracker:
    """Does nothing unless `active`; every method is safe to call on any rank."""

    def __init__(self, cfg: Config, active: bool) -> None:
        self.client = None
        self.run_id: str | None = None
        self.model_uri: str | None = None
        self._buffer: list[Any] = []
        self._monitor = None
        if not active:
            return
        uri = cfg.tracking.uri or default_uri()
        # fail fast on a server that isn't there, instead of minutes of retries
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        from mlflow.tracking import MlflowClient

        try:
            client = MlflowClient(tracking_uri=uri)
            self.experiment_id = experiment_id(client, cfg.tracking.experiment, uri)
        except Exception as err:
            msg = f"tracking store {uri} can't be reached: {type(err).__name__}: {err}"
            if cfg.tracking.required:
                raise TrackingError(
                    msg + " (set tracking.required: false to train without it)"
                ) from None
            print(f"[abtrain] warning: {msg}; training on without tracking", file=sys.stderr)
            return
        self.client, self.uri = client, uri

    def start(
        self,
        cfg: Config,
        tags: dict[str, Any],
        run_id: str | None,
        name: str,
        dataset: dict[str, Any] | None = None,
    ) -> None:
        """Open the run (or reopen it on resume): config as params, the data set as an
        input; then sample system metrics until `finish`."""
        if self.client is None:
            return
        from mlflow.entities import Dataset, DatasetInput, InputTag, Param

        if run_id is not None:
            self.run_id = run_id
            self.client.update_run(run_id, status="RUNNING")
        else:
            run = self.client.create_run(
                self.experiment_id, run_name=name, tags={k: str(v) for k, v in tags.items()}
            )
            self.run_id = run.info.run_id
            params = [Param(k, str(v)) for k, v in flatten(cfg.dump()).items()]
            for i in range(0, len(params), 100):
                self.client.log_batch(self.run_id, params=params[i : i + 100])
            if dataset is not None:
                entity = Dataset(
                    name=dataset["name"],
                    digest=dataset["digest"],
                    source_type="local",
                    source=json.dumps({"uri": dataset["source"]}),
                    profile=json.dumps(dataset["profile"]),
                )
                context = InputTag("mlflow.data.context", "train")
                self.client.log_inputs(self.run_id, [DatasetInput(entity, [context])])
        self._start_system_metrics(resumed=run_id is not None)

    def _start_system_metrics(self, resumed: bool) -> None:
        try:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            # its start/stop lines at INFO would interleave with the training log
            logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)
            monitor = SystemMetricsMonitor(
                self.run_id,
                sampling_interval=SYSTEM_METRICS_INTERVAL_S,
                resume_logging=resumed,
                tracking_uri=self.uri,
            )
            monitor.start()  # a daemon thread: it never holds the process at exit
            self._monitor = monitor
        except Exception as err:  # psutil missing, say: the run itself is unaffected
            print(f"[abtrain] warning: no system metrics: {err}", file=sys.stderr)

    def _stop_system_metrics(self) -> None:
        monitor, self._monitor = self._monitor, None
        if monitor is None:
            return
        try:
            monitor.finish()
            # one last sample, so a run shorter than the interval still has one
            monitor.collect_metrics()
            monitor.publish_metrics(monitor.aggregate_metrics())
            monitor.mlflow_logger.flush()
        except Exception as err:
            print(f"[abtrain] warning: system metrics: {err}", file=sys.stderr)

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

    def text(self, content: str, artifact_file: str) -> None:
        """A small artifact from memory (replaced if it exists)."""
        if self.client is None or self.run_id is None:
            return
        self.client.log_text(self.run_id, content, artifact_file)

    def artifacts(self, paths: list[Path]) -> None:
        if self.client is None:
            return
        for p in paths:
            if p.exists():
                self.client.log_artifact(self.run_id, str(p))

    def model(self, model: Any, example: Any, step: int) -> None:
        """Log `model` (a plain torch module on the CPU) as an MLflow model of this run,
        its signature inferred from `example` (a small input batch)."""
        if self.client is None or self.run_id is None:
            return
        import mlflow
        import mlflow.pytorch
        import torch
        from mlflow.models import infer_signature

        self.flush()  # the model is linked to the run's metrics at `step`
        mlflow.set_tracking_uri(self.uri)
        # without it the model would go to the "Default" experiment, not to its run's
        mlflow.set_experiment(experiment_id=self.experiment_id)
        with torch.no_grad():
            signature = infer_signature(example.numpy(), model(example).numpy())
        # its warning that pickles run code when loaded, on every run: this is our own model
        logging.getLogger("mlflow.pytorch").setLevel(logging.ERROR)
        info = mlflow.pytorch.log_model(
            model,
            name="model",
            signature=signature,
            run_id=self.run_id,
            step=step,
            # stated, not inferred: inference imports the model in a subprocess (seconds)
            pip_requirements=[f"torch=={torch.__version__.split('+')[0]}"],
            # pickled: it loads wherever abtrain imports; "pt2" would torch.export the model
            # at the end of every run (seconds to minutes) and validate it once more
            serialization_format="pickle",
        )
        self.model_uri = info.model_uri

    def finish(self, status: str) -> None:
        if self.client is None or self.run_id is None:
            return
        self.flush()
        self._stop_system_metrics()
        self.client.set_terminated(self.run_id, status=status)
