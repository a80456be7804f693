"""`python -m abtrain compare`: a table of finished runs, each run's inter-node traffic
against the ddp run of its own model, data and scale."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from abtrain.config import BASELINE, comparison_point, model_label


def read_run(folder: Path) -> dict:
    """One finished run: its summary, with what older summaries lack (the batch per rank,
    model and data) read from the run's config.json."""
    s = json.loads((folder / "summary.json").read_text())
    config = folder / "config.json"
    cfg = json.loads(config.read_text()) if config.exists() else {}
    batch = s.get("batch_size", cfg.get("batch_size"))
    if batch is None:
        raise ValueError("neither summary.json nor config.json gives batch_size")
    world, nodes = s["world_size"], s["nodes"]
    return dict(
        name=folder.name or str(folder),
        method=s["method"],
        scale=f"{nodes}x{world // nodes}",
        batch=f"{batch}/{s.get('global_batch', batch * world)}",
        top1=s["val_top1"]["best"],
        compression=s.get("compression_ratio"),
        mb=s["traffic"]["inter_node_bytes"] / s["steps"] / 1e6,
        point=comparison_point(
            model_label(cfg["model"]) if "model" in cfg else s.get("run", {}).get("model"),
            cfg.get("data", {}).get("name", s.get("run", {}).get("data")),
            nodes,
            world // nodes,
            batch,
        ),
    )


def run(runs: list[str]) -> int:
    """Table of finished runs; each run's traffic against the ddp run of its comparison point
    (`config.comparison_point`; "—" where there is none among `runs`)."""
    rows = []
    for run in runs:
        folder = Path(run)
        if not (folder / "summary.json").exists():
            print(
                f"error: {folder / 'summary.json'} does not exist (run not finished?)",
                file=sys.stderr,
            )
            return 2
        try:
            rows.append(read_run(folder))
        except (ValueError, KeyError, TypeError) as err:
            print(f"error: {folder}: {err}", file=sys.stderr)
            return 2
    baseline = {}
    for r in rows:
        if r["method"] == BASELINE:
            baseline.setdefault(r["point"], r)
    header = (
        "run",
        "method",
        "nodes x ranks",
        "batch/rank / global",
        "best top-1",
        "compr.",
        "inter-node MB/step/rank",
        "vs ddp",
    )
    table = [header]
    for r in rows:
        # a ddp row is its own baseline: another seed of the same scale still reads 1.000
        base = r if r["method"] == BASELINE else baseline.get(r["point"])
        table.append(
            (
                r["name"],
                r["method"],
                r["scale"],
                r["batch"],
                f"{r['top1']:.2f}%",
                "—" if r["compression"] is None else f"{r['compression']:.2f}",
                f"{r['mb']:.3f}",
                f"{r['mb'] / base['mb']:.3f}" if base and base["mb"] else "—",
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        cells = [c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))]
        print("  ".join(cells).rstrip())
    return 0
