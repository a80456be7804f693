"""What abtrain tells MLflow's web UI (3.17) about how to show an experiment: the pages it
opens on, a saved view of the runs table with each run's key figures as columns, and the
names, rounding and description line of a run's headline figures. Kept apart from
tracking.py, which sends the runs' data: these are the UI's conventions, which change
between MLflow releases.
"""

from __future__ import annotations

import json
import time
from typing import Any

from abtrain.config import BASELINE

# MLflow 3 opens an experiment without this tag on its GenAI overview (traces, prompts); with
# it, on the runs table. The UI's own "custom model development" choice writes this value.
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
# A run's headline, logged at its end under names that MLflow 3.17's compare view sorts to the
# top of its metric table (it sorts keys by character code: capitals before every lowercase
# key, `system/` included), rounded as a reader quotes them (the series keep every digit).
TOP1_BEST, TOP1_FINAL = "Top-1 best", "Top-1 final"
BYTES_VS_DDP = "Bytes vs DDP"  # inter-node bytes per step over the matching DDP run's
COMPRESSION = "Compression"
HEADLINE = (TOP1_BEST, TOP1_FINAL, BYTES_VS_DDP, COMPRESSION)
NOTE_START = "Key figures:"  # the line of them that starts the run's description
# The runs table shows no metric by default (its default columns are fixed in the UI) and keeps
# a user's choice in the browser only; a saved view, an experiment tag the UI lists under
# "Views" and opens from a link, is the store's way to show columns without choosing them.
KEY_FIGURES_VIEW = "key-figures"
KEY_FIGURES = (
    *HEADLINE,
    "final/inter_node_mb_per_step",
    "final/wall_seconds",
    "best_error",  # a search's parent run
)
# the view abtrain saved before the headline metrics: an experiment still showing it unchanged
# gets today's
EARLIER_KEY_FIGURES = (
    "final/val_top1_best",
    "final/val_top1_final",
    "final/inter_node_mb_per_step",
    "final/compression_ratio",
    "final/wall_seconds",
    "best_error",
)
# wide enough for each name in the header (13 px type), so that the headline's four columns
# fit in a 1400 px window beside the run's name
COLUMN_WIDTHS = {
    TOP1_BEST: 110,
    TOP1_FINAL: 110,
    BYTES_VS_DDP: 125,
    COMPRESSION: 125,
    "final/inter_node_mb_per_step": 215,
    "final/wall_seconds": 150,
    "best_error": 110,
}


def headline(summary: dict[str, Any], ddp_bytes_per_step: float | None) -> dict[str, float]:
    """A finished run's headline metrics from its summary.json: top-1 to 2 decimals, ratios
    to 3; `Bytes vs DDP` only when the DDP run's inter-node bytes per step are known and
    not 0 (a DDP run is its own baseline)."""
    figures = {
        TOP1_BEST: round(summary["val_top1"]["best"], 2),
        TOP1_FINAL: round(summary["val_top1"]["final"], 2),
        COMPRESSION: round(summary["compression_ratio"], 3),
    }
    own = summary["traffic"]["inter_node_bytes_per_step"]
    if summary["method"] == BASELINE:
        ddp_bytes_per_step = own
    if ddp_bytes_per_step:
        figures[BYTES_VS_DDP] = round(own / ddp_bytes_per_step, 3)
    return figures


def headline_note(figures: dict[str, float], note: str) -> str:
    """The run's description (`note`, shown at the top of the run page) led by a paragraph of
    its headline figures, which replaces an earlier one."""
    shown = " · ".join(f"{k} **{figures[k]:g}**" for k in HEADLINE if k in figures)
    rest = note.partition("\n\n")[2] if note.startswith(NOTE_START) else note
    return f"{NOTE_START} {shown}\n\n{rest}".strip()[:5000]


def key_figures_view() -> tuple[str, str]:
    """The saved view "Key figures" as the experiment tag the UI reads: the runs table with
    each run's headline metrics as columns (MLflow 3.17's envelope: name, times, state)."""
    columns = [f"metrics.`{k}`" for k in KEY_FIGURES]
    widths = {f"metrics.`{k}`": w for k, w in COLUMN_WIDTHS.items()}
    # in this order (else alphabetical)
    state = json.dumps(dict(selectedColumns=columns, columnOrder=columns, columnWidths=widths))
    now = int(time.time() * 1000)
    envelope = dict(name="Key figures", createdAt=now, updatedAt=now, state=state)
    return f"mlflow.sharedViewState.{KEY_FIGURES_VIEW}", json.dumps(envelope)


def is_earlier_view(value: str) -> bool:
    """Whether a saved view's tag value is the Key figures view as abtrain saved it before
    (not one a user has changed since)."""
    try:
        columns = json.loads(json.loads(value)["state"])["selectedColumns"]
    except (ValueError, KeyError, TypeError):
        return False
    return columns == [f"metrics.`{k}`" for k in EARLIER_KEY_FIGURES]


def key_figures_link(experiment: str) -> str:
    """The UI's address, after its root, of the runs table in the key-figures view (the
    workflow type: else MLflow 3.17 may open the GenAI pages)."""
    return (
        f"#/experiments/{experiment}/runs?viewStateShareKey={KEY_FIGURES_VIEW}"
        "&workflowType=machine_learning"
    )


def ui_address(uri: str, experiment: str) -> str:
    """Where the key-figures view of a store's UI is: the server's own for a server URI, else
    that of `python -m abtrain ui` at its default address over the store."""
    if uri.startswith(("http://", "https://")):
        return uri.rstrip("/") + "/" + key_figures_link(experiment)
    return (
        f"http://127.0.0.1:5000/{key_figures_link(experiment)} "
        f"(after `python -m abtrain ui --store {uri}`)"
    )
