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
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from abtrain.config import BASELINE, Config, comparison_point, model_label
from abtrain.tracking.views import (
    BYTES_VS_DDP,
    EXPERIMENT_KIND,
    TOP1_BEST,
    headline,
    headline_note,
    is_earlier_view,
    key_figures_view,
    ui_address,
)

ARTIFACTS_DIR = "mlartifacts"
PER_STEP = "inter_node_bytes_per_step"  # a run's final metric (results.final_metrics)
SYSTEM_METRICS_INTERVAL_S = 10  # MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL overrides it
# The compare view's first plot shows the metric a run was sent first; a new run's first
# batch leads with these, and its system metrics start after it
FIRST_METRICS = ("val_top1", "val_loss", "val_top5", "loss")


class TrackingError(RuntimeError):
    pass


class TrackingLost(TrackingError):
    """The store went away mid-run under `tracking.required: true`: the run stopped at a
    checkpoint (every rank together) and resumes from it when started again."""


UNSENT = "mlflow_unsent.jsonl"  # in the run folder: what a lost store did not get
# in the run folder of a run stopped for its store: which MLflow run `close` ends
STOPPED = "mlflow_stopped.json"


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


def damaged_store(uri: str) -> str | None:
    """Why a SQLite tracking store can't be used (a file cut short, bytes flipped on disk:
    SQLite's own integrity check), or None: not SQLite, not there yet, or whole. MLflow would
    call a damaged file unreachable, or read and write it without a word."""
    import sqlite3

    if not uri.startswith("sqlite:///"):
        return None
    path = Path(uri[len("sqlite:///") :])
    if not path.exists():
        return None
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            found = [row[0] for row in db.execute("PRAGMA integrity_check")]
    except sqlite3.DatabaseError as err:
        found = [str(err)]
    if found == ["ok"]:
        return None
    return (
        f"tracking store {path} is damaged ({found[0]}): move it aside (mv {path} "
        f"{path}.damaged) to start a new one, or --set tracking.enabled=false"
    )


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
            name,
            artifact_location=artifact_location(uri),
            tags=dict([EXPERIMENT_KIND, key_figures_view()]),
        )
    for key, value in (EXPERIMENT_KIND, key_figures_view()):
        # a view the user has since edited is theirs; abtrain's earlier one is replaced
        if key not in exp.tags or is_earlier_view(exp.tags[key]):
            client.set_experiment_tag(exp.experiment_id, key, value)
    return exp.experiment_id


def model_name(run_name: str) -> str:
    """The run's name as a logged model's name: MLflow 3 refuses / : . % " ' in it."""
    return re.sub(r"[/:.%\"'\s]+", "-", run_name).strip("-") or "model"


def run_name_for(cfg: Config, nodes: int, ranks_per_node: int) -> str:
    """`tracking.run_name`, or one that tells the points of an experiment's matrix apart and
    shows whole in MLflow's runs table (about 22 characters): method, nodes x ranks per node
    and the batch per rank. The model and data are the run's tags and Dataset column; each
    profile, which fixes them, keeps its own experiment."""
    return cfg.tracking.run_name or f"{cfg.method}-{nodes}x{ranks_per_node}-b{cfg.batch_size}"


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


def run_tags(cfg: Config, where: dict[str, Any], global_batch: int, out: Path) -> dict[str, Any]:
    """A new run's tags: what it trains and on what, the commit, the folder it writes;
    `where`: world_size, nodes, ranks_per_node."""
    commit = git_commit()
    return dict(
        method=cfg.method,
        model=model_label(cfg.model),
        dataset=cfg.data.name,
        world_size=where["world_size"],
        nodes=where["nodes"],
        ranks_per_node=where["ranks_per_node"],
        batch_size=cfg.batch_size,
        global_batch=global_batch,
        point=comparison_point(
            model_label(cfg.model),
            cfg.data.name,
            where["nodes"],
            where["ranks_per_node"],
            cfg.batch_size,
        ),
        git_commit=commit,
        out_dir=str(out.resolve()),
        **source_tags(commit),
        **dvc_tags(),
        **{"mlflow.note.content": description(commit)},
        **cfg.tracking.tags,
    )


# what DVC puts in a stage's environment (`dvc exp run`: the last two), as run tags
DVC_ENV = dict(
    DVC_STAGE="dvc.stage", DVC_EXP_NAME="dvc.experiment", DVC_EXP_BASELINE_REV="dvc.baseline"
)


def dvc_tags() -> dict[str, str]:
    """What DVC tells a stage's command: its stage and, under `dvc exp run`, the
    experiment's name and the commit it started from."""
    return {tag: os.environ[var] for var, tag in DVC_ENV.items() if os.environ.get(var)}


def params_changed(path: str = "params.yaml") -> list[str]:
    """`key=value` for each value of a DVC stage's params.yaml that differs from the file at
    the commit checked out (what `dvc exp run -S` set); [] outside a stage or git."""
    import yaml

    from abtrain.config import diff_keys

    if not os.environ.get("DVC_STAGE") or not Path(path).exists():
        return []
    try:
        head = subprocess.run(
            ["git", "show", f"HEAD:./{path}"], capture_output=True, text=True, timeout=10
        )
        old, new = yaml.safe_load(head.stdout), yaml.safe_load(Path(path).read_text())
    except (OSError, subprocess.SubprocessError, yaml.YAMLError):
        return []
    if head.returncode or not isinstance(old, dict) or not isinstance(new, dict):
        return []
    out = []
    for key in diff_keys(old, new):
        value = new
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        out.append(f"{key}={json.dumps(value)}")
    return out


def description(commit: str) -> str:
    """The run's description (MLflow's note): what tells apart runs of one name, such as a
    matrix run again under `dvc exp run`."""
    dvc = dvc_tags()
    lines = [f"Commit {commit[:12]}."]
    if "dvc.stage" in dvc:
        lines.append(f"DVC stage {dvc['dvc.stage']}.")
    if "dvc.experiment" in dvc:
        base = dvc.get("dvc.baseline", "?")[:12]
        lines.append(f"DVC experiment {dvc['dvc.experiment']} (from commit {base}).")
    changed = params_changed()
    if changed:
        lines.append("params.yaml differs from the commit in: " + ", ".join(changed) + ".")
    return "\n".join(lines)[:5000]


def describe_dataset(cfg: Config, task: Any) -> dict[str, Any]:
    """The training data as MLflow's input: a prepared folder is named by its folder and
    identified by its meta.json; generated data by its config and seed."""
    d = cfg.data
    meta = getattr(task, "meta", None)
    if meta is None:
        described = dict(d.model_dump(mode="json"), seed=cfg.seed)
        name, source, val = d.name, f"generated (seed {cfg.seed})", d.val_samples
    else:
        described = meta
        name, source = Path(d.prepared).name, d.source or f"torchvision {d.name}"
        val = sum(meta["counts"]["val"].values())
    profile = dict(train_samples=len(task), val_samples=val, classes=task.classes)
    if meta is not None:
        profile["prepared"] = d.prepared
    return dict(name=name, digest=dataset_digest(described), source=source, profile=profile)


def open_for_run(
    cfg: Config, out: Path, rank: int, device: Any, ledger: Any
) -> tuple[Tracker, Any]:
    """Rank 0 takes the run folder (one run at a time in it; its lock is returned) and
    opens the store; every rank learns whether it could, so all stop alike."""
    import torch

    from abtrain.files import take_folder

    tracker, lock, error = Tracker(cfg, active=False), None, ""
    if rank == 0:
        lock, error = take_folder(out)
    if rank == 0 and cfg.tracking.enabled and not error:
        try:
            tracker = Tracker(cfg, active=True, out=out)
        except TrackingError as err:
            error = str(err)
    ok = torch.tensor([0 if error else 1], device=device)
    ledger.broadcast(ok, src=0)
    if not ok.item():
        raise TrackingError(error or "rank 0 could not take the run folder or reach the store")
    return tracker, lock


class Tracker:
    """Does nothing unless `active`; every method is safe to call on any rank.

    A store that goes away mid-run never stops training by itself: the request that fails
    is reported once, with its step, and `lost` says why. Metrics are kept and sent again at
    the next flush (so a store that comes back gets them all); what is still unsent at the
    end goes to `OUT/mlflow_unsent.jsonl`. Under `tracking.required: true` the trainer
    then stops at its next checkpoint (`must_stop`).
    """

    def __init__(self, cfg: Config, active: bool, out: Path | None = None) -> None:
        self.client = None
        self.run_id: str | None = None
        self.run_name: str | None = None
        self.model_uri: str | None = None
        self.lost: str | None = None  # why the store stopped answering, while it doesn't
        self.required = cfg.tracking.required
        self.out = out
        self._buffer: list[Any] = []
        self._monitor = None
        self._first_batch = False  # a new run's first metrics are not in the store yet
        self._step = 0  # the last step metrics were logged at, for the report of a loss
        if not active:
            return
        uri = cfg.tracking.uri or default_uri()
        if (why := damaged_store(uri)) is not None:  # whatever tracking.required says
            raise TrackingError(why)
        fail_fast()
        from mlflow.tracking import MlflowClient

        try:
            client = MlflowClient(tracking_uri=uri)
            self.experiment_id = experiment_id(client, cfg.tracking.experiment, uri)
        except Exception as err:
            msg = f"tracking store {uri} can't be reached: {type(err).__name__}: {err}"
            if cfg.tracking.required:
                raise TrackingError(
                    msg + " (or --set tracking.required=false to train without it)"
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
            self.run_name = self.client.get_run(run_id).info.run_name
            self._send_kept()
            if self.out is not None:  # going on: no longer a stopped run to close
                (self.out / STOPPED).unlink(missing_ok=True)
        else:
            name = self._distinct(name, tags)
            run = self.client.create_run(
                self.experiment_id, run_name=name, tags={k: str(v) for k, v in tags.items()}
            )
            self.run_id, self.run_name = run.info.run_id, name
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
        if run_id is None:  # sampling starts once the run's own metrics lead (flush)
            self._first_batch = True
        else:
            self._start_system_metrics(resumed=True)
        where = ui_address(self.uri, self.experiment_id)
        print(f"[abtrain] MLflow run {self.run_name!r}; all runs' key figures: {where}", flush=True)

    def _distinct(self, name: str, tags: dict[str, Any]) -> str:
        """`name (experiment)` under `dvc exp run` when the experiment has a run of this
        name already (the matrix run before), else `name`."""
        experiment = tags.get("dvc.experiment")
        if not experiment or "'" in name:
            return name
        earlier = self.client.search_runs(
            [self.experiment_id], f"attributes.run_name = '{name}'", max_results=1
        )
        return f"{name} ({experiment})" if earlier else name

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

    @property
    def must_stop(self) -> bool:
        """The store is gone and the config says the run needs it."""
        return self.lost is not None and self.required

    def _send(self, what: str, request: Any, *args: Any, store: bool = True) -> bool:
        """One request; False (reported once per loss) if it failed. Only a write the
        store itself took (`store`: metrics, a status) says it is back: an artifact goes to
        the artifact store, which may answer while the tracking store does not."""
        try:
            request(*args)
        except Exception as err:
            if self.lost is None:
                self.lost = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
                then = "stopping at the next checkpoint" if self.required else "training on"
                print(
                    f"[abtrain] warning: tracking store {self.uri} lost at step {self._step} "
                    f"({what}: {self.lost}); {then}, keeping what it did not get",
                    file=sys.stderr,
                    flush=True,
                )
            return False
        if self.lost is not None and store:
            print(f"[abtrain] tracking store {self.uri} is back", file=sys.stderr, flush=True)
            self.lost = None
        return True

    def metrics(self, step: int, values: dict[str, float]) -> None:
        if self.client is None:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._step = step
        self._buffer += [Metric(k, float(v), now, step) for k, v in values.items()]
        if len(self._buffer) >= 500 and self.lost is None:
            self.flush()

    def flush(self) -> None:
        if self.client is None or self.run_id is None:
            return
        if self._first_batch:
            # the compare view's first plot is the run's first metric: an evaluation's top-1
            # when there is one, not CPU utilisation (system metrics start after this batch)
            rank = {k: i for i, k in enumerate(FIRST_METRICS)}
            self._buffer.sort(key=lambda m: rank.get(m.key, len(rank)))
        while self._buffer:
            batch = self._buffer[:1000]
            if not self._send("metrics", self.client.log_batch, self.run_id, batch):
                return
            self._buffer = self._buffer[len(batch) :]
        if self._first_batch:
            self._first_batch = False
            self._start_system_metrics(resumed=False)

    def text(self, content: str, artifact_file: str) -> None:
        """A small artifact from memory (replaced if it exists)."""
        if self.client is None or self.run_id is None:
            return
        send = self.client.log_text
        self._send(artifact_file, send, self.run_id, content, artifact_file, store=False)

    def artifacts(self, paths: list[Path]) -> None:
        if self.client is None or self.run_id is None:
            return
        for p in paths:
            if p.exists():
                self._send(p.name, self.client.log_artifact, self.run_id, str(p), store=False)

    def _send_kept(self) -> None:
        """A resumed run sends what a lost store did not get before (then forgets it)."""
        if self.out is None or not (kept := kept_metrics(self.out)):
            return
        self._buffer = kept + self._buffer
        self.flush()
        if not self._buffer:
            (self.out / UNSENT).unlink()
            print(
                f"[abtrain] sent {len(kept)} kept metric values from {self.out / UNSENT}",
                flush=True,
            )

    def _keep_unsent(self) -> None:
        """Metrics the store never got, one JSON object a line (MLflow's fields), in the
        run folder: nothing measured is lost with the store."""
        if not self._buffer or self.out is None:
            return
        from abtrain.files import append_lines

        path = self.out / UNSENT
        rows = [
            json.dumps(dict(key=m.key, value=m.value, timestamp=m.timestamp, step=m.step))
            for m in self._buffer
        ]
        append_lines(path, rows)
        print(
            f"[abtrain] warning: tracking store {self.uri} did not get {len(rows)} metric "
            f"values ({self.lost}); they are in {path}, the run's files in {self.out}",
            file=sys.stderr,
            flush=True,
        )
        self._buffer = []

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
        if self.lost is not None:
            raise TrackingError(f"tracking store {self.uri} lost ({self.lost})")
        mlflow.set_tracking_uri(self.uri)
        # without it the model would go to the "Default" experiment, not to its run's
        mlflow.set_experiment(experiment_id=self.experiment_id)
        with torch.no_grad():
            signature = infer_signature(example.numpy(), model(example).numpy())
        # its warning that pickles run code when loaded, on every run: this is our own model
        logging.getLogger("mlflow.pytorch").setLevel(logging.ERROR)
        info = mlflow.pytorch.log_model(
            model,
            name=model_name(self.run_name or "model"),
            signature=signature,
            run_id=self.run_id,
            # the model page's "Logged from": what ran, not the entry file (`__main__.py`)
            tags=source_tags(git_commit()),
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
        if self.must_stop:  # stopped for the store, which its last try found gone: no
            # more tries, each may hang (a locked SQLite file: 20 s) while the other ranks
            # have stopped; the run stays RUNNING in the store until it is resumed. The
            # system metrics' thread (a daemon) is left to end with the process.
            self._monitor = None
            self._keep_unsent()
            if self.out is not None:
                from abtrain.files import write_record

                record = dict(uri=self.uri, run_id=self.run_id, run_name=self.run_name)
                write_record(self.out / STOPPED, {**record, "lost": self.lost})
            return
        if status == "FINISHED":
            self._headline()
        self.flush()
        self._stop_system_metrics()
        self._keep_unsent()
        if self.lost is None:
            self._send("end of run", self.client.set_terminated, self.run_id, status)

    # ------------------------------------------------------------ the headline, at the end
    def _headline(self) -> None:
        """The finished run's headline metrics (mlflow_ui.headline) from the summary.json it
        has just written, also as the first paragraph of its description; a DDP run gives
        their figure against DDP to the runs of its point that finished before it."""
        path = self.out / "summary.json" if self.out is not None else None
        if path is None or not path.exists():
            return
        summary = json.loads(path.read_text())
        point = self._point() if self.lost is None else None
        ddp = self._ddp_bytes_per_step(point) if point and summary["method"] != BASELINE else None
        figures = headline(summary, ddp)
        self.metrics(summary["steps"], figures)
        self.flush()
        if self.lost is None:
            self._note(self.run_id, figures)
        if point and summary["method"] == BASELINE:
            self._give_baseline(point, summary["traffic"]["inter_node_bytes_per_step"])

    def _point(self) -> str | None:
        """A search filter for the finished runs of this run's comparison point
        (`config.comparison_point`, the tag `point`) on the same data set (its digest: one
        store may hold several data sets of one name), or None if unknown."""
        try:
            run = self.client.get_run(self.run_id)
        except Exception as err:
            print(f"[abtrain] warning: no {BYTES_VS_DDP}: {err}", file=sys.stderr)
            return None
        point = run.data.tags.get("point")
        if point is None or "'" in point:
            return None
        terms = [f"tags.point = '{point}'", "attributes.status = 'FINISHED'"]
        terms += [f"dataset.digest = '{d.dataset.digest}'" for d in run.inputs.dataset_inputs]
        return " and ".join(terms)

    def _ddp_bytes_per_step(self, point: str) -> float | None:
        """The inter-node bytes per step of the newest finished DDP run of this point."""
        try:
            found = self.client.search_runs(
                [self.experiment_id],
                f"{point} and tags.method = '{BASELINE}'",
                order_by=["attributes.start_time DESC"],
                max_results=1,
            )
        except Exception as err:
            print(f"[abtrain] warning: no {BYTES_VS_DDP}: {err}", file=sys.stderr)
            return None
        return found[0].data.metrics.get(PER_STEP) if found else None

    def _give_baseline(self, point: str, ddp_bytes_per_step: float) -> None:
        """`Bytes vs DDP` for the runs of this point that finished with a headline but
        without it (before any DDP run of theirs did), so the figure doesn't depend on the
        order runs end in."""
        if not ddp_bytes_per_step:
            return
        try:
            runs = self.client.search_runs(
                [self.experiment_id], f"{point} and tags.method != '{BASELINE}'", max_results=1000
            )
            for run in runs:
                metrics = run.data.metrics
                if BYTES_VS_DDP in metrics or not {TOP1_BEST, PER_STEP} <= set(metrics):
                    continue
                ratio = round(metrics[PER_STEP] / ddp_bytes_per_step, 3)
                # at the step of the run's other headline metrics, its last
                step = self.client.get_metric_history(run.info.run_id, TOP1_BEST)[-1].step
                self.client.log_metric(run.info.run_id, BYTES_VS_DDP, ratio, step=step)
                self._note(run.info.run_id, {**metrics, BYTES_VS_DDP: ratio})
        except Exception as err:
            print(f"[abtrain] warning: {BYTES_VS_DDP} of earlier runs: {err}", file=sys.stderr)

    def _note(self, run_id: str, figures: dict[str, float]) -> None:
        """The run's description, led by its headline figures (shown atop the run page)."""
        try:
            note = self.client.get_run(run_id).data.tags.get("mlflow.note.content", "")
            self.client.set_tag(run_id, "mlflow.note.content", headline_note(figures, note))
        except Exception as err:
            print(f"[abtrain] warning: the run's description: {err}", file=sys.stderr)


def fail_fast() -> None:
    """A store that isn't there fails a request at once, instead of after minutes of retries."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")


def kept_metrics(out: Path) -> list[Any]:
    """The metric values a lost store did not get (`OUT/mlflow_unsent.jsonl`), as MLflow's."""
    path = out / UNSENT
    if not path.exists():
        return []
    from mlflow.entities import Metric

    return [Metric(**json.loads(x)) for x in path.read_text().splitlines() if x.strip()]


def close_stopped(out: Path) -> str:
    """End the MLflow run of a run that stopped for its lost store (exit 3) and will not be
    resumed, once the store is back: the values it kept are sent, the run marked failed
    (finished, if it had written its summary). No process waits for the store meanwhile:
    nothing of a run outlives it. Resuming the run later reopens the same MLflow run."""
    record = out / STOPPED
    if not record.exists():
        raise TrackingError(
            f"{out} holds no {STOPPED}: only a run that stopped for its tracking store "
            "(exit 3) is closed so"
        )
    from abtrain.files import read_record

    again = "start the run again with its command once the store is back: it resumes its MLflow run"
    rec = read_record(record, ("uri", "run_id"), remake=again)
    fail_fast()
    from mlflow.tracking import MlflowClient

    rows = kept_metrics(out)
    latest = out / "checkpoints" / "LATEST"
    step = latest.read_text().strip() if latest.exists() else "?"
    finished = (out / "summary.json").exists()
    status = "FINISHED" if finished else "FAILED"
    try:
        client = MlflowClient(tracking_uri=rec["uri"])
        for i in range(0, len(rows), 1000):
            client.log_batch(rec["run_id"], metrics=rows[i : i + 1000])
        why = f"stopped at the checkpoint of step {step}: tracking store lost ({rec.get('lost')})"
        client.set_tag(rec["run_id"], "abtrain.stopped", why[:5000])
        client.set_terminated(rec["run_id"], status)
    except Exception as err:
        raise TrackingError(
            f"tracking store {rec['uri']} is not back ({type(err).__name__}: "
            f"{str(err).splitlines()[0][:300]}); nothing changed in {out}"
        ) from None
    (out / UNSENT).unlink(missing_ok=True)
    record.unlink()
    return (
        f"MLflow run {rec.get('run_name')!r} ({rec['run_id']}) marked {status.lower()}, "
        f"{len(rows)} kept metric values sent; starting the run again still resumes it"
    )
