"""The study in MLflow: a parent run with the verdict, the figure and the record, each
point a nested run (abtrain.tracking.nested)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


# ---------------------------------------------------------------- MLflow
def log_to_mlflow(data: dict[str, Any], out: Path, uri: str, experiment: str) -> str:
    """The study as one parent run (the verdict, the figure, the record), each point a
    nested run with its values and figures; returns the parent's id."""
    from abtrain.tracking.nested import NestedRuns

    runs = NestedRuns(uri, experiment)
    client = runs.client
    pid = runs.parent(
        "tradeoff", {"budgets": json.dumps(data["budgets"])}, tags={"abtrain.study": "tradeoff"}
    )
    client.set_tag(pid, "verdict", data["verdict"][:5000])
    for name in ("points.json", "tradeoff.png", "README.md"):
        client.log_artifact(pid, str(out / name))
    for p in data["points"]:
        cid = runs.child(
            pid,
            f"{p['method']}-{p['backend']}-{p['id']}",
            tags={"method": p["method"], "backend": p["backend"]},
            params=p["params"],
        )
        for k in ("best_top1", "bytes_vs_ddp", "compression", "kept_rank"):
            client.log_metric(cid, k, float(p[k]))
        client.log_metric(cid, "inter_node_mb_per_rank", p["inter_node_bytes_per_rank"] / 1e6)
        client.log_metric(cid, "front", float(p["front"]))
        client.set_terminated(cid)
    client.set_terminated(pid)
    return pid
