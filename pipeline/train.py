"""Stage `train@NAME`: one run of the experiment matrix, launched as its nodes ask.

Writes runs/train/NAME (the run folder: summary, ledger, checkpoints), results/NAME.json
(its whole summary and the run's place in the matrix: what the report reads),
metrics/NAME.json (a few scalars, for `dvc metrics show` and `dvc exp show`) and
plots/NAME.json (one row per evaluation, for DVC plots). A folder holding the same config's
unfinished run is resumed; another config's is cleared.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from abtrain import config as abconfig
from abtrain.commands.localrun import run_local
from abtrain.files import write_record
from abtrain.run.progress import duration
from pipeline.matrix import MatrixRun, best_config, provenance, resolve, runs, seeds
from pipeline.resolve import check as check_resolved
from pipeline.stage import PARAMS, RUNS, SEARCHES, params, parser, stage

RESULTS, METRICS, PLOTS = Path("results"), Path("metrics"), Path("plots")


def search_tags(p: dict) -> list[str]:
    """MLflow tags naming the search record whose values the run takes: its backend, path
    and a hash of its bytes (tags only: they change no number the run computes)."""
    if not p["search"]["use_best"]:
        return []
    backend = p["search"]["backend"]
    path = SEARCHES / backend / "best.json"
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    tags = {"search_backend": backend, "search_record": str(path), "search_sha256": digest}
    return [f"tracking.tags.{k}={json.dumps(v)}" for k, v in tags.items()]


def scalars(result: dict[str, Any]) -> dict[str, float]:
    """metrics/NAME.json: what one compares runs by, a handful of numbers (the ratio to the
    ddp baseline needs the other runs: the report writes it)."""
    return dict(
        top1_best=result["val_top1"]["best"],
        top1_final=result["val_top1"]["final"],
        inter_node_mb_per_step=round(
            result["traffic"]["inter_node_bytes"] / result["steps"] / 1e6, 4
        ),  # per rank
        compression=round(result["compression_ratio"], 4),
        wall_minutes=round(result["wall_seconds"] / 60, 2),
    )


def curve(name: str, result: dict[str, Any]) -> list[dict[str, Any]]:
    """plots/NAME.json: one row per evaluation; inter_node_mb is the per-rank running total."""
    return [
        dict(
            run=name,
            step=e["step"],
            val_top1=e["val_top1"],
            val_loss=e["val_loss"],
            inter_node_mb=e["inter_node_bytes"] / 1e6,
            samples=e["samples"],
        )
        for e in result["evals"]
    ]


def seed_folders(p: dict, name: str) -> list[tuple[int, Path]]:
    """(seed, run folder) of each seed of run NAME: `train.seed` and the next
    `experiments.seeds` - 1. The first trains in runs/train/NAME, the others in
    runs/train/NAME/seeds/SEED (inside the stage's output, resumed and cleared with it)."""
    out = RUNS / "train" / name
    return [(s, out if i == 0 else out / "seeds" / str(s)) for i, s in enumerate(seeds(p))]


def over_seeds(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """One result of a run trained at several seeds: the first seed's summary (its curve,
    traffic, compression, time) with top-1 as the mean over the seeds (and its sample sd,
    `best_sd`, `final_sd`) and each seed's figures under `seeds`."""
    import statistics

    result = dict(summaries[0])
    if len(summaries) == 1:
        return result
    result["seeds"] = [
        dict(
            seed=s["seed"],
            val_top1=s["val_top1"],
            compression_ratio=s["compression_ratio"],
            inter_node_bytes=s["traffic"]["inter_node_bytes"],
            wall_seconds=s["wall_seconds"],
        )
        for s in summaries
    ]
    top1 = {}
    for key in ("best", "final"):
        values = [s["val_top1"][key] for s in summaries]
        top1[key], top1[f"{key}_sd"] = statistics.mean(values), statistics.stdev(values)
    result["val_top1"] = top1
    return result


def write_outputs(name: str, run: MatrixRun, cfg: abconfig.Config, summary: dict[str, Any]) -> None:
    from abtrain.config import model_label as label

    result = dict(summary)
    result["run"] = dict(
        name=name,
        nodes=run.nodes,
        ranks_per_node=run.ranks_per_node,
        batch=run.batch,
        global_batch=summary["world_size"] * cfg.batch_size,
        model=label(cfg.model),  # a run's ddp baseline is that of the same model and data
        data=cfg.data.name,
    )
    write_record(RESULTS / f"{name}.json", result)
    write_record(METRICS / f"{name}.json", scalars(result))
    write_record(PLOTS / f"{name}.json", curve(name, result))


def stage_line(matrix: dict[str, MatrixRun], name: str, steps: str) -> str:
    """Which run of the matrix this is (its place in experiments.runs), its shape and length."""
    run = matrix[name]
    return (
        f"[pipeline] train run {list(matrix).index(name) + 1} of {len(matrix)}: {name} "
        f"({run.nodes} nodes x {run.ranks_per_node} ranks, {steps} steps)"
    )


def finished_summary(p: dict, run: MatrixRun, best: dict | None) -> dict | None:
    """The summary of `run`'s folder if it holds a finished run of the run's config as it is
    now (settings that change nothing trained aside, abtrain.config.NOT_TRAINING), else None."""
    folder = RUNS / "train" / run.name
    try:
        saved = json.loads((folder / "config.json").read_text())
        summary = json.loads((folder / "summary.json").read_text())
        now = abconfig.from_dict(p["train"], [o.text for o in resolve(p, run, best)]).dump()
    except (OSError, ValueError):  # missing or unreadable files; a config that fails later
        return None
    return None if abconfig.training_diff(saved, now) else summary


def runs_left(p: dict, matrix: dict[str, MatrixRun], name: str, best: dict | None) -> str:
    """How many runs of the matrix are not finished yet, this one included, and the time they
    take at the pace of those finished (their mean training time): no estimate without one."""
    walls = [
        s["wall_seconds"]
        for other, run in matrix.items()
        if other != name and (s := finished_summary(p, run, best)) is not None
    ]
    left = len(matrix) - len(walls)
    head = f"[pipeline] runs of the matrix not finished: {left} (this one included)"
    if not walls:
        return f"{head}; no finished run yet to estimate their time from"
    mean = sum(walls) / len(walls)
    return (
        f"{head}, about {duration(left * mean)} of training (launches not counted) at the "
        f"pace of the {len(walls)} finished ({duration(mean)} each on average)"
    )


def main(name: str) -> int:
    p = params()
    matrix = runs(p)
    if name not in matrix:
        raise SystemExit(f"experiments.runs has no run named {name!r}")
    run = matrix[name]
    best = best_config(p)
    check_resolved(p, run, best)  # what DVC tracked for this run is what trains
    resolved = resolve(p, run, best)
    steps = next(o.value for o in reversed(resolved) if o.key == "steps")
    print(stage_line(matrix, name, steps), flush=True)
    print(runs_left(p, matrix, name, best), flush=True)
    # the values a user set and the ones that replaced them, in the stage's log
    print(f"[pipeline] {name}: values not taken from `train` (a later source wins):", flush=True)
    for line in provenance(p, resolved):
        print(f"[pipeline]   {line}", flush=True)
    sets = [o.text for o in resolved]
    # MLflow's name and tags for the run: the matrix's name, its scale and batch scheme
    sets += [
        f"tracking.run_name={json.dumps(name)}",
        f"tracking.tags.scale={json.dumps(f'{run.nodes}x{run.ranks_per_node}')}",
        f"tracking.tags.batch={json.dumps(run.batch)}",
        *search_tags(p),
    ]
    summaries, folders = [], seed_folders(p, name)
    for seed, out in folders:
        if len(folders) > 1:
            print(f"[pipeline] {name}: seed {seed} ({len(summaries) + 1} of {len(folders)})")
        seed_sets = sets if seed == p["train"]["seed"] else [*sets, f"seed={seed}"]
        code = train_one(p, run, seed_sets, out)
        if code:
            return code
        summaries.append({**json.loads((out / "summary.json").read_text()), "seed": seed})
    cfg = abconfig.load(PARAMS, sets)
    write_outputs(name, run, cfg, over_seeds(summaries))
    return 0


def train_one(p: dict, run: MatrixRun, sets: list[str], out: Path) -> int:
    """Train (or resume, or find finished) one run folder; the launcher's exit code."""
    saved = out / "config.json"
    cfg = abconfig.load(PARAMS, sets)
    if saved.exists() and abconfig.training_diff(json.loads(saved.read_text()), cfg.dump()):
        shutil.rmtree(out)  # another run's (settings that change nothing trained may differ)
    elif saved.exists() and (out / "summary.json").exists():
        print(f"[pipeline] {out} holds this run finished; not trained again", flush=True)
        return 0
    args = [
        "train",
        "--config",
        str(PARAMS),
        *sum((["--set", s] for s in sets), []),
        "--out",
        str(out),
    ]
    if p["experiments"]["launcher"] == "local":
        return run_local(run.nodes, run.ranks_per_node, args)
    from pipeline.slurm import run_slurm

    return run_slurm(p, run, args, out)


if __name__ == "__main__":
    ap = parser("pipeline.train", __doc__)
    ap.add_argument("name", help="a run of experiments.runs in params.yaml")
    sys.exit(stage(main, ap.parse_args().name))
