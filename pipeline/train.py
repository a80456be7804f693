"""Stage `train@NAME`: one run of the experiment matrix, launched as its nodes ask.

Writes runs/train/NAME (the run folder: summary, ledger, checkpoints), metrics/NAME.json
(its summary, a DVC metrics file) and plots/NAME.json (its learning curve, for DVC plots).
A folder holding the same config's unfinished run is resumed; another config's is cleared.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from abtrain import config as abconfig
from abtrain.checkpoint import atomic_write_text
from abtrain.launch import run_local
from pipeline.common import PARAMS, RUNS, params, run_overrides, runs


def best_config(p: dict) -> dict | None:
    if not p["search"]["use_best"]:
        return None
    path = RUNS / "search" / p["search"]["backend"] / "best.json"
    if not path.exists():
        raise SystemExit(f"search.use_best is true but {path} does not exist: run the search stage")
    return json.loads(path.read_text())


def main(name: str) -> int:
    p = params()
    matrix = runs(p)
    if name not in matrix:
        raise SystemExit(f"experiments.runs has no run named {name!r}")
    run = matrix[name]
    sets = run_overrides(p, run, best_config(p))
    out = RUNS / "train" / name
    saved = out / "config.json"
    if saved.exists():
        cfg = abconfig.load(PARAMS, sets)
        if json.loads(saved.read_text()) != cfg.dump():
            shutil.rmtree(out)
    launcher = p["experiments"]["launcher"]
    args = [
        "train",
        "--config",
        str(PARAMS),
        *sum((["--set", s] for s in sets), []),
        "--out",
        str(out),
    ]
    if launcher == "local":
        code = run_local(run.nodes, run.ranks_per_node, args)
    else:
        from pipeline.slurm import run_slurm

        code = run_slurm(p, run, args, out)
    if code:
        return code
    summary = json.loads((out / "summary.json").read_text())
    cfg = abconfig.load(PARAMS, sets)
    summary["run"] = dict(
        name=name,
        nodes=run.nodes,
        ranks_per_node=run.ranks_per_node,
        batch=run.batch,
        global_batch=summary["world_size"] * cfg.batch_size,
        model=cfg.model.name,  # a run's ddp baseline is that of the same model and data
        data=cfg.data.name,
    )
    atomic_write_text(Path("metrics") / f"{name}.json", json.dumps(summary, indent=2))
    curve = [
        dict(step=e["step"], val_top1=e["val_top1"], val_loss=e["val_loss"])
        for e in summary["evals"]
    ]
    atomic_write_text(Path("plots") / f"{name}.json", json.dumps(curve, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
