"""Propulate 1.2.2: islands of workers breeding configurations, with migration.

Worked around here (see the README): choices are integer indices, log floats are searched
as log10, no built-in surrogate (pruning is the objective's own median rule), the process
group is made once per worker, and `generations` is never left at its default 0. Its
banner, printed by `Islands()` on rank 0 with no switch to turn it off, goes to rank 0's
log file rather than the console. A resume whose checkpoint holds none of a worker's
individuals would fail on that worker (`resumable`).
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import pickle
import random
from pathlib import Path

from search import space
from search.context import Context, tradeoff_loss


def run(ctx: Context) -> None:
    from mpi4py import MPI
    from propulate import Islands, get_default_propagator, set_logger_config

    s, world = ctx.scfg, ctx.world
    workers = world.size // s.ranks_per_worker
    set_logger_config(
        log_file=str(ctx.out / f"propulate_r{world.rank}.log"),  # the banner's too (below)
        log_to_stdout=False,
        log_rank=True,
        colors=False,
    )
    rng = random.Random(s.seed * 1009 + world.rank)
    limits = space.propulate_limits(s.space)

    def loss(ind, comm=MPI.COMM_SELF) -> float:
        hp = space.from_propulate(ind, s.space)
        island, worker, gen = int(ind.island), int(ind.rank), int(ind.generation)
        tags = dict(island=island, worker=worker, generation=gen)
        outcome = ctx.evaluate(hp, f"i{island}-w{worker}-g{gen}", tags, comm)
        if s.objective == "tradeoff":
            return tradeoff_loss(outcome, s.byte_budget)
        return outcome.error

    if world.rank == 0:
        for line in resumable(ctx.out / "checkpoints", workers, s.islands):
            print(line, flush=True)
    world.Barrier()
    log = ctx.out / f"propulate_r{world.rank}.log"
    with log.open("a") as banner, contextlib.redirect_stdout(banner):
        islands = Islands(
            loss,
            get_default_propagator(2 * workers, limits, rng=rng),
            rng,
            generations=math.ceil(s.evaluations / workers),  # per worker
            num_islands=s.islands,
            migration_probability=s.migration_probability,
            pollination=s.pollination,
            checkpoint_path=str(ctx.out / "checkpoints"),
            ranks_per_worker=s.ranks_per_worker,
        )
    islands.propulate(logging_interval=1, debug=1)


def island_sizes(workers: int, islands: int) -> list[int]:
    """Workers per island, as Propulate deals them out (the first islands take the rest)."""
    base, rest = divmod(workers, islands)
    return [base + (i < rest) for i in range(islands)]


def resumable(checkpoints: Path, workers: int, islands: int) -> list[str]:
    """Make each island's checkpoint one Propulate 1.2.2 can resume from; what was done.

    A resumed worker starts at 1 + the latest generation of its own individuals in its
    island's checkpoint (`Propulator.__init__`): a worker with none there (the search was
    killed before the worker that dumps had received any of its results) fails on `max()` of
    an empty sequence, and the island's other workers wait for it forever. Such a worker gets
    an inactive copy of a recorded individual, stamped with its rank and generation -1: it
    starts at generation 0 as a new worker would, and the copy breeds and migrates nowhere
    (Propulate breeds and migrates active individuals only). A checkpoint with no individual
    at all is moved aside: every worker starts afresh, as without one. Written whole, in
    place of the file Propulate would read (the checkpoint or its `.bkp`)."""
    done = []
    for island, size in enumerate(island_sizes(workers, islands)):
        path = checkpoints / f"island_{island}_ckpt.pickle"
        if not path.is_file():
            path = path.with_suffix(".bkp")
        if not path.is_file():
            continue
        with path.open("rb") as f:
            population = pickle.load(f)
        if not population:
            os.replace(path, path.with_name(path.name + ".empty"))
            done.append(
                f"{path}: no individual recorded; moved aside, island {island} starts afresh"
            )
            continue
        missing = sorted(set(range(size)) - {ind.rank for ind in population})
        for rank in missing:
            stand_in = copy.deepcopy(population[0])
            stand_in.rank, stand_in.current, stand_in.generation = rank, rank, -1
            stand_in.active = False
            population.append(stand_in)
        if missing:
            tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
            with tmp.open("wb") as f:
                pickle.dump(population, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            workers_ = ", ".join(map(str, missing))
            done.append(
                f"{path}: no individual of island {island}'s worker(s) {workers_} yet; they "
                "start at generation 0"
            )
    return done
