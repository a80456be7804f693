"""Optuna: TPE sampling and median pruning on the per-evaluation errors, the study in a
journal file so several workers share it and a killed search resumes. Under objective
`tradeoff`, two objectives (the best validation error and the inter-node bytes per rank),
sampled by TPE's multi-objective form, with no pruning (Optuna prunes one objective only).

Each worker (ranks_per_worker ranks, as for Propulate) asks the study for a trial, trains
it on its ranks, and tells the result; a file lock keeps the total at the budget.
"""

from __future__ import annotations

import fcntl
from contextlib import contextmanager

from search import space
from search.context import Context


@contextmanager
def _locked(path):
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def sampler(s, worker: int):
    """TPE with its random start set explicitly: `search.startup_trials` random trials (the
    same count before the median pruner acts), then TPE's own proposals. Optuna's default
    start, 10 random trials, is the whole budget of a short search: it never searches."""
    import optuna

    return optuna.samplers.TPESampler(
        seed=s.seed * 1009 + worker, n_startup_trials=max(1, s.startup_trials)
    )


def run(ctx: Context) -> None:
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    from optuna.trial import TrialState

    s, world = ctx.scfg, ctx.world
    comm = world.Split(color=world.rank // s.ranks_per_worker, key=world.rank)
    worker = world.rank // s.ranks_per_worker
    study = None
    tradeoff = s.objective == "tradeoff"
    if comm.rank == 0:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        aims = dict(directions=["minimize", "minimize"]) if tradeoff else dict(direction="minimize")
        study = optuna.create_study(
            study_name="search",
            storage=JournalStorage(JournalFileBackend(str(ctx.out / "optuna.journal"))),
            sampler=sampler(s, worker),
            pruner=optuna.pruners.MedianPruner(
                n_startup_trials=s.startup_trials, n_warmup_steps=max(0, s.prune_after_evals - 1)
            ),
            **aims,
            load_if_exists=True,
        )
    if world.rank == 0:  # trials cut off by a kill: failed, not part of the budget
        for t in study.get_trials(deepcopy=False, states=[TrialState.RUNNING]):
            study.tell(t.number, state=TrialState.FAIL)
    world.Barrier()
    counted = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
    while True:
        trial, hp = None, None
        if comm.rank == 0:
            with _locked(ctx.out / "optuna.lock"):
                spent = study.get_trials(deepcopy=False, states=counted) + [
                    t  # a tradeoff trial that failed was an evaluation (one cut off was not)
                    for t in study.get_trials(deepcopy=False, states=[TrialState.FAIL])
                    if t.user_attrs.get("status") in ("diverged", "crashed", "invalid")
                ]
                if len(spent) < s.evaluations:
                    trial = study.ask()
                    hp = space.suggest(trial, s.space)
        hp = comm.bcast(hp, root=0)
        if hp is None:
            break
        number = comm.bcast(trial.number if trial else None, root=0)

        def stop(i: int, error: float, trial=trial) -> bool:
            if tradeoff:
                return False
            trial.report(error, i)
            return trial.should_prune()

        outcome = ctx.evaluate(hp, f"t{number}", dict(trial=number, worker=worker), comm, stop)
        if comm.rank == 0:
            trial.set_user_attr("status", outcome.status)
            if outcome.status == "pruned":
                study.tell(trial, state=TrialState.PRUNED)
            elif not tradeoff:
                study.tell(trial, outcome.error)
            elif outcome.inter_node_bytes is None:  # failed: no point of the trade-off
                study.tell(trial, state=TrialState.FAIL)
            else:
                study.tell(trial, [min(outcome.errors), outcome.inter_node_bytes])
