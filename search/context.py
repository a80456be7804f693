"""What every evaluation needs, whichever backend asked for it.

Its own module so the imports run one way: driver -> backends -> context.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import Any

from abtrain import config as abconfig
from abtrain.run.progress import duration
from search import objective, record, space


class Context:
    """What every evaluation needs, whichever backend asked for it."""

    def __init__(
        self,
        raw: dict[str, Any],
        scfg: space.SearchConfig,
        out: Path,
        world: Any,
        started: float,
        parent: str,
        mlflow_runs: record.SearchRuns,
    ) -> None:
        self.train_raw, self.scfg, self.out, self.world = raw["train"], scfg, out, world
        self.started, self.parent, self.mlflow_runs = started, parent, mlflow_runs
        self.steps = search_base(raw, scfg).steps
        workers = world.size // scfg.ranks_per_worker
        # Propulate runs whole generations: every worker evaluates ceil(budget / workers)
        self.total = (
            math.ceil(scfg.evaluations / workers) * workers
            if scfg.backend == "propulate"
            else scfg.evaluations
        )
        self.session_start = time.time()  # the rate for the ETA: this session's, not a killed one's
        self.done_before = len(record.evaluations(out))

    def evaluate(
        self, hp: dict[str, Any], tag: str, tags: dict[str, Any], comm: Any, stop=None
    ) -> objective.Outcome:
        """Train one individual on `comm`'s ranks and record it (on the worker's root)."""
        sets = space.overrides(hp, self.scfg.space, self.steps)
        run_overrides = [*self.scfg.train, *sets, "tracking.enabled=false"]
        root = comm.rank == 0
        child = self.mlflow_runs.child(self.parent, tag, tags, hp) if root else ""
        t0 = time.time() - self.started
        if root:
            done = len(record.evaluations(self.out))
            point = " ".join(_short(o) for o in sets)
            print(f"{tag} started ({done} of {self.total} evaluations done): {point}", flush=True)
        outcome = objective.evaluate(
            self.train_raw,
            run_overrides,
            comm,
            self.out / "individuals" / tag,
            self.scfg.penalty,
            stop or self.median_rule,
            self.scfg.nodes,
        )
        if root:
            row = dict(
                backend=self.scfg.backend,
                id=tag,
                **tags,
                params=hp,
                overrides=sets,
                error=outcome.error,
                status=outcome.status,
                errors=outcome.errors,
                inter_node_bytes=outcome.inter_node_bytes,
                compression=outcome.compression,
                kept_rank=outcome.kept_rank,
                message=outcome.message[:500],
                t_start=t0,
                t_end=time.time() - self.started,
            )
            record.append_evaluation(self.out, row)
            self.mlflow_runs.finish_child(child, outcome)
            self.report(tag, outcome, time.time() - self.started - t0)
        return outcome

    def report(self, tag: str, outcome: objective.Outcome, seconds: float) -> None:
        """`evaluation 3 of 8 (t5): ok, error 61.20% (best 58.00%) after 3 validations in
        41 s; elapsed 3m05s, ETA 2m30s`; k counts the rows on disk, every worker's."""
        rows = record.evaluations(self.out)
        ok = [r["error"] for r in rows if r["status"] == "ok"]
        best = f"best {min(ok):.2f}%" if ok else "no finished run yet"
        elapsed = time.time() - self.session_start
        session_done = len(rows) - self.done_before
        left = max(0, self.total - len(rows))
        eta = duration(elapsed / session_done * left) if session_done > 0 else "?"
        print(
            f"evaluation {len(rows)} of {self.total} ({tag}): {outcome.status}, error "
            f"{outcome.error:.2f}% ({best}) after {len(outcome.errors)} validation(s) in "
            f"{duration(seconds)}; elapsed {duration(elapsed)}, ETA {eta}",
            flush=True,
        )

    def median_rule(self, i: int, error: float) -> bool:
        """Prune when worse than the median of finished runs at the same evaluation; never
        under objective `tradeoff`, where a worse error may buy fewer bytes."""
        if self.scfg.objective == "tradeoff":
            return False
        if i + 1 < self.scfg.prune_after_evals or self.scfg.prune_after_evals == 0:
            return False
        seen = [
            r["errors"][i]
            for r in record.evaluations(self.out)
            if r["status"] == "ok" and len(r["errors"]) > i
        ]
        return len(seen) >= max(1, self.scfg.startup_trials) and error > statistics.median(seen)


def tradeoff_loss(outcome: objective.Outcome, budget: float | None) -> float:
    """Propulate's one number for the trade-off: the best validation error (%) of a run
    within `budget` inter-node bytes per rank; over it, the error plus 100 points for each
    budget's worth sent: worse than any run within it (an error is at most 100), and less
    bad the nearer the budget, so a search that starts over the budget is led under it. A
    failed run keeps its penalty."""
    if outcome.inter_node_bytes is None or not outcome.errors:
        return outcome.error
    best = min(outcome.errors)
    if budget is None or outcome.inter_node_bytes <= budget:
        return best
    return best + 100.0 * (outcome.inter_node_bytes / budget)


def _short(override: str) -> str:
    """`optim.lr=0.0014050388998463588` as `optim.lr=0.00141`, for the progress line."""
    key, _, value = override.partition("=")
    try:
        return f"{key}={float(value):.3g}" if "." in value or "e" in value else override
    except ValueError:
        return override


def search_base(raw: dict[str, Any], scfg: space.SearchConfig) -> abconfig.Config:
    """The config of the search's runs at the space's low corner (validated already)."""
    return abconfig.from_dict(*space.low_corner(raw["train"], scfg))
