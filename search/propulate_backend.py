"""Propulate 1.2.2: islands of workers breeding configurations, with migration.

Worked around here (see the README): choices are integer indices, log floats are searched
as log10, no built-in surrogate (pruning is the objective's own median rule), the process
group is made once per worker, and `generations` is never left at its default 0. Its
banner, printed by `Islands()` on rank 0 with no switch to turn it off, goes to rank 0's
log file rather than the console.
"""

from __future__ import annotations

import contextlib
import math
import random

from search import space
from search.context import Context


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
        return ctx.evaluate(hp, f"i{island}-w{worker}-g{gen}", tags, comm).error

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
