"""A parent MLflow run with a nested child run for each of its parts: a search and its
individuals or trials, a study and its points. The experiment is made as a training run's is
(`tracker.experiment_id`: its artifacts in `mlartifacts/` beside the store), so a study's
figure and record land where every other run's do."""

from __future__ import annotations

from typing import Any

from abtrain.tracking import tracker


class NestedRuns:
    """Parent and child runs in experiment `experiment` of the store at `uri`."""

    def __init__(self, uri: str | None, experiment: str) -> None:
        from mlflow.tracking import MlflowClient

        self.uri = uri or tracker.default_uri()
        self.client = MlflowClient(tracking_uri=self.uri)
        self.experiment = experiment
        exp = self.client.get_experiment_by_name(experiment)
        self.experiment_id: str | None = exp.experiment_id if exp else None

    def made(self) -> str:
        """The experiment's id, making it (with its artifact location) if it is new; called
        by the one process that makes the parent, so that no two race to create it."""
        if self.experiment_id is None:
            self.experiment_id = tracker.experiment_id(self.client, self.experiment, self.uri)
        return self.experiment_id

    def known(self) -> str:
        """The experiment's id, made by the parent's process before any child is asked for."""
        if self.experiment_id is None:
            self.experiment_id = self.client.get_experiment_by_name(self.experiment).experiment_id
        return self.experiment_id

    def parent(self, name: str, params: dict[str, Any], tags: dict[str, str] | None = None) -> str:
        run = self.client.create_run(self.made(), run_name=name, tags=tags or {})
        for k, v in tracker.flatten(params).items():
            self.client.log_param(run.info.run_id, k, str(v)[:6000])
        return run.info.run_id

    def child(self, parent: str, name: str, tags: dict[str, Any], params: dict[str, Any]) -> str:
        run = self.client.create_run(
            self.known(),
            run_name=name,
            tags={"mlflow.parentRunId": parent, **{k: str(v) for k, v in tags.items()}},
        )
        for k, v in params.items():
            self.client.log_param(run.info.run_id, k, str(v))
        return run.info.run_id

    def children(self, parent: str, where: str = "", **search: Any) -> list[Any]:
        """The parent's child runs (and `where`, a further MLflow filter)."""
        text = f"tags.mlflow.parentRunId = '{parent}'" + (f" and {where}" if where else "")
        return self.client.search_runs([self.known()], text, **search)
