"""What a search leaves behind: its state file, every evaluation, the best configuration,
and MLflow (a parent run per search, a child run per individual or trial)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from abtrain.checkpoint import atomic_write_text, diff_keys
from abtrain.tracking import default_uri, flatten

STATUSES = ("ok", "pruned", "diverged", "crashed", "invalid")


class SearchError(RuntimeError):
    pass


def open_search(out: Path, state: dict[str, Any], resume: bool) -> dict[str, Any]:
    """Rank 0: start a search in `out`, or check that `--resume` continues the same one."""
    path = out / "search.json"
    if path.exists():
        if not resume:
            raise SearchError(
                f"{out} already holds a search: pass --resume to continue it, or choose a new --out"
            )
        saved = json.loads(path.read_text())
        differ = diff_keys({k: saved[k] for k in state}, state)
        if differ:
            raise SearchError(
                f"{out} holds a search with other settings ({', '.join(differ)} differ): "
                "its checkpoints don't fit this run"
            )
        return saved
    if resume:
        raise SearchError(f"--resume: {out} holds no search to resume")
    state = {**state, "started": time.time()}
    atomic_write_text(path, json.dumps(state, indent=2))
    return state


def append_evaluation(out: Path, row: dict[str, Any]) -> None:
    """One line per evaluation; an O_APPEND write of one line is atomic between workers."""
    line = (json.dumps(row) + "\n").encode()
    fd = os.open(out / "evaluations.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def evaluations(out: Path) -> list[dict[str, Any]]:
    """Every evaluation, once: an individual evaluated again after a resume (Propulate's
    checkpoint can lag its last results) keeps its latest row."""
    path = out / "evaluations.jsonl"
    if not path.exists():
        return []
    rows = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            rows.pop(row["id"], None)
            rows[row["id"]] = row
    return list(rows.values())


def write_best(out: Path) -> dict[str, Any]:
    rows = [r for r in evaluations(out) if r["status"] in ("ok", "pruned")]
    if not rows:
        raise SearchError(f"{out}: no individual finished, so there is no best configuration")
    finished = [r for r in rows if r["status"] == "ok"] or rows
    best = min(finished, key=lambda r: r["error"])
    errors = sorted(r["error"] for r in finished)
    result = dict(
        backend=best["backend"],
        id=best["id"],
        error=best["error"],
        median_error=errors[len(errors) // 2],
        evaluations=len(evaluations(out)),
        params=best["params"],
        overrides=best["overrides"],
    )
    atomic_write_text(out / "best.json", json.dumps(result, indent=2))
    return result


class Tracking:
    """MLflow parent and child runs. Only worker roots call it; none of it is collective."""

    def __init__(self, uri: str | None, experiment: str, enabled: bool) -> None:
        self.client = None
        if not enabled:
            return
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri or default_uri())
        exp = self.client.get_experiment_by_name(experiment)
        self.experiment_id = exp.experiment_id if exp else None
        self.experiment = experiment

    def parent(self, name: str, params: dict[str, Any], run_id: str | None) -> str:
        """Rank 0: the search's run (reopened on resume, its stale children marked KILLED)."""
        if self.client is None:
            return ""
        if self.experiment_id is None:
            self.experiment_id = self.client.create_experiment(self.experiment)
        if run_id:
            self.client.update_run(run_id, status="RUNNING")
            stale = self.client.search_runs(
                [self.experiment_id],
                f"tags.mlflow.parentRunId = '{run_id}' and attributes.status = 'RUNNING'",
            )
            for run in stale:
                self.client.set_terminated(run.info.run_id, status="KILLED")
            return run_id
        run = self.client.create_run(self.experiment_id, run_name=name)
        for k, v in flatten(params).items():
            self.client.log_param(run.info.run_id, k, str(v)[:6000])
        return run.info.run_id

    def child(self, parent: str, name: str, tags: dict[str, Any], hp: dict[str, Any]) -> str:
        if self.client is None:
            return ""
        if self.experiment_id is None:
            self.experiment_id = self.client.get_experiment_by_name(self.experiment).experiment_id
        run = self.client.create_run(
            self.experiment_id,
            run_name=name,
            tags={"mlflow.parentRunId": parent, **{k: str(v) for k, v in tags.items()}},
        )
        for k, v in hp.items():
            self.client.log_param(run.info.run_id, k, str(v))
        return run.info.run_id

    def finish_child(self, run_id: str, outcome: Any) -> None:
        if self.client is None:
            return
        for i, err in enumerate(outcome.errors):
            self.client.log_metric(run_id, "val_error", err, step=i)
        self.client.log_metric(run_id, "objective", outcome.error)
        self.client.set_tag(run_id, "status", outcome.status)
        self.client.set_tag(run_id, "pruned", str(outcome.status == "pruned").lower())
        status = "FINISHED" if outcome.status in ("ok", "pruned") else "FAILED"
        self.client.set_terminated(run_id, status=status)

    def finish_parent(self, run_id: str, best: dict[str, Any] | None) -> None:
        if self.client is None or not run_id:
            return
        if best:
            self.client.log_metric(run_id, "best_error", best["error"])
            self.client.log_metric(run_id, "median_error", best["median_error"])
        self.client.set_terminated(run_id, status="FINISHED")
