"""What abtrain tells MLflow's web UI (3.17) about how to show an experiment: the pages it
opens on and a saved view of the runs table with each run's key figures as columns. Kept
apart from tracking.py, which sends the runs' data: these are the UI's conventions, which
change between MLflow releases.
"""

from __future__ import annotations

import json
import time

# MLflow 3 opens an experiment without this tag on its GenAI overview (traces, prompts); with
# it, on the runs table. The UI's own "custom model development" choice writes this value.
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
# The runs table shows no metric by default (its default columns are fixed in the UI) and keeps
# a user's choice in the browser only; a saved view, an experiment tag the UI lists under
# "Views" and opens from a link, is the store's way to show columns without choosing them.
KEY_FIGURES_VIEW = "key-figures"
KEY_FIGURES = (
    "final/val_top1_best",
    "final/val_top1_final",
    "final/inter_node_mb_per_step",
    "final/compression_ratio",
    "final/wall_seconds",
    "best_error",  # a search's parent run
)


def key_figures_view() -> tuple[str, str]:
    """The saved view "Key figures" as the experiment tag the UI reads: the runs table with
    each run's headline metrics as columns (MLflow 3.17's envelope: name, times, state)."""
    columns = [f"metrics.`{k}`" for k in KEY_FIGURES]
    # in this order (else alphabetical) and wide enough for the names they have
    widths = {c: 150 for c in columns}
    state = json.dumps(dict(selectedColumns=columns, columnOrder=columns, columnWidths=widths))
    now = int(time.time() * 1000)
    envelope = dict(name="Key figures", createdAt=now, updatedAt=now, state=state)
    return f"mlflow.sharedViewState.{KEY_FIGURES_VIEW}", json.dumps(envelope)


def key_figures_link(experiment: str) -> str:
    """The UI's address, after its root, of the runs table in the key-figures view (the
    workflow type: else MLflow 3.17 may open the GenAI pages)."""
    return (
        f"#/experiments/{experiment}/runs?viewStateShareKey={KEY_FIGURES_VIEW}"
        "&workflowType=machine_learning"
    )


def ui_address(uri: str, experiment: str) -> str:
    """Where the key-figures view of a store's UI is: the server's own for a server URI, else
    that of `mlflow ui` at its default address over the store."""
    if uri.startswith(("http://", "https://")):
        return uri.rstrip("/") + "/" + key_figures_link(experiment)
    return (
        f"http://127.0.0.1:5000/{key_figures_link(experiment)} "
        f"(after `mlflow ui --backend-store-uri {uri}`)"
    )
