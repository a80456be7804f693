"""`python -m search`: validate, open the search folder, run a backend, write the best.

Launch with `mpirun -n N python -m mpi4py -m search ...` (mpi4py then aborts the job when
one rank raises, instead of leaving the others blocked), or plainly for one rank.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from abtrain import config as abconfig
from abtrain.files import write_record
from abtrain.run.progress import duration
from search import progress, record, space


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m search")
    p.add_argument("--config", default="params.yaml", help="params.yaml: sections train, search")
    p.add_argument("--backend", choices=["propulate", "optuna"], help="overrides search.backend")
    p.add_argument("--out", required=True, help="this search's folder")
    p.add_argument("--resume", action="store_true", help="continue the search in --out")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="e.g. search.evaluations=8 or train.steps=100",
    )
    return p.parse_args(argv)


def validate(args: argparse.Namespace, world_size: int) -> tuple[dict, space.SearchConfig]:
    """Everything that can be wrong with the settings, before any rank trains."""
    path = Path(args.config)
    try:
        raw = abconfig.read_yaml(path)
    except (OSError, yaml.YAMLError, abconfig.ConfigError) as err:
        raise space.SpaceError(f"{path}: {err}") from None
    if not isinstance(raw, dict) or not {"train", "search"} <= set(raw):
        raise space.SpaceError(f"{path}: needs sections `train` and `search`")
    raw = abconfig.apply_overrides(copy.deepcopy(raw), args.overrides)
    if args.backend:
        raw["search"]["backend"] = args.backend
    scfg = space.load(raw["search"])
    base, low = space.low_corner(raw["train"], scfg)
    space.check_exists(scfg.space, base)
    try:  # the search's runs: `train`, `search.train`, and a point of the space
        abconfig.from_dict(base, low)
    except abconfig.ConfigError as err:
        raise space.SpaceError(f"search.train with the space's low corner: {err}") from None
    space.check_keys(scfg.space, abconfig.apply_overrides(base, low))
    if world_size % scfg.ranks_per_worker:
        raise space.SpaceError(
            f"search.ranks_per_worker={scfg.ranks_per_worker} does not divide the {world_size} ranks"
        )
    workers = world_size // scfg.ranks_per_worker
    if scfg.backend == "propulate" and scfg.islands > workers:
        raise space.SpaceError(f"search.islands={scfg.islands} exceeds the {workers} workers")
    return raw, scfg


def identity(raw: dict[str, Any], scfg: space.SearchConfig, world_size: int) -> dict[str, Any]:
    """What a resume must match: the budget may grow (and Optuna's random start with it,
    which only moves where TPE begins), the rest would mix two searches."""
    return dict(
        backend=scfg.backend,
        world_size=world_size,
        ranks_per_worker=scfg.ranks_per_worker,
        search=scfg.model_dump(mode="json", exclude=set(record.MAY_GROW)),
        train=raw["train"],
    )


def differing_settings(argv: list[str], world_size: int) -> list[str]:
    """For a caller deciding before it launches (the pipeline): the settings in which these
    arguments differ from the search already in `--out` (empty: `--resume` fits).

    Raises SpaceError or ConfigError for invalid settings, OSError or ValueError for an
    unreadable search.json.
    """
    args = parse(argv)
    raw, scfg = validate(args, world_size)
    saved = json.loads((Path(args.out) / "search.json").read_text())
    return record.settings_differ(saved, identity(raw, scfg, world_size))


def main(argv: list[str] | None = None) -> int:
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    args = parse(argv)
    out = Path(args.out)
    error, raw, scfg, state = None, None, None, None
    try:
        raw, scfg = validate(args, world.size)
    except (space.SpaceError, abconfig.ConfigError) as err:
        error = str(err)
    if error is None and world.rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        try:
            state = record.open_search(out, identity(raw, scfg, world.size), args.resume)
        except record.SearchError as err:
            error = str(err)
    error = world.bcast(error, root=0)
    if error:
        if world.rank == 0:
            print(f"error: {error}", file=sys.stderr)
        return 2
    # torch only once the search starts: a search refused (its settings, --resume, its
    # world) says so on each rank in a fraction of a second, and the pipeline's stage,
    # which asks differing_settings() before it launches, imports no torch for it
    from search import objective
    from search.context import Context, search_base

    objective.local_threads(world)
    t = search_base(raw, scfg).tracking
    worker_root = world.rank % scfg.ranks_per_worker == 0  # the only ranks that log
    # the searches' own experiment beside the runs': the matrix's page lists its runs only,
    # and a search's shows its trials with their own figures
    experiment = record.search_experiment(t.experiment)
    mlflow_runs = record.SearchRuns(t.uri, experiment, t.enabled and world.rank == 0)
    world.Barrier()  # rank 0 has created the store: no concurrent schema migrations
    if world.rank != 0:
        mlflow_runs = record.SearchRuns(t.uri, experiment, t.enabled and worker_root)
    if world.rank == 0:
        # the ranks it ran on, not those params.yaml asked for (an mpirun -n of its own)
        settings = {**scfg.model_dump(mode="json"), "ranks": world.size}
        state["parent"] = mlflow_runs.parent(
            f"search-{scfg.backend}", settings, state.get("parent")
        )
        write_record(out / "search.json", state)
    state = world.bcast(state, root=0)
    ctx = Context(raw, scfg, out, world, state["started"], state["parent"], mlflow_runs)
    if scfg.backend == "propulate":
        from search.propulate_backend import run
    else:
        from search.optuna_backend import run
    with progress.tagged(progress.tag_for(world.rank, scfg.ranks_per_worker)):
        if world.rank == 0:
            workers = world.size // scfg.ranks_per_worker
            print(
                f"{scfg.backend}: {ctx.total} evaluations on {workers} worker(s) of "
                f"{scfg.ranks_per_worker} rank(s), {ctx.done_before} done before",
                flush=True,
            )
        run(ctx)
        world.Barrier()
        if world.rank == 0:
            best = record.write_best(out)
            mlflow_runs.finish_parent(state["parent"], best)
            print(
                f"best error {best['error']:.2f}% (median {best['median_error']:.2f}%) after "
                f"{best['evaluations']} evaluations in "
                f"{duration(time.time() - ctx.session_start)}: "
                f"{' '.join(best['overrides'])}",
                flush=True,
            )
    return 0
