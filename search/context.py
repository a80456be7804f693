"""What every evaluation needs, whichever backend asked for it.

Its own module so the imports run one way: driver -> backends -> context.
"""

from __future__ import annotations

import copy
import statistics
import time
from pathlib import Path
from typing import Any

from abtrain import config as abconfig
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
        tracking: record.Tracking,
    ) -> None:
        self.train_raw, self.scfg, self.out, self.world = raw["train"], scfg, out, world
        self.started, self.parent, self.tracking = started, parent, tracking
        self.steps = search_base(raw, scfg).steps

    def evaluate(
        self, hp: dict[str, Any], tag: str, tags: dict[str, Any], comm: Any, stop=None
    ) -> objective.Outcome:
        """Train one individual on `comm`'s ranks and record it (on the worker's root)."""
        sets = space.overrides(hp, self.scfg.space, self.steps)
        run_overrides = [*self.scfg.train, *sets, "tracking.enabled=false"]
        root = comm.rank == 0
        child = self.tracking.child(self.parent, tag, tags, hp) if root else ""
        t0 = time.time() - self.started
        outcome = objective.evaluate(
            self.train_raw,
            run_overrides,
            comm,
            self.out / "individuals" / tag,
            self.scfg.penalty,
            stop or self.median_rule,
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
                message=outcome.message[:500],
                t_start=t0,
                t_end=time.time() - self.started,
            )
            record.append_evaluation(self.out, row)
            self.tracking.finish_child(child, outcome)
            print(f"[search] {tag}: {outcome.status} error {outcome.error:.2f}", flush=True)
        return outcome

    def median_rule(self, i: int, error: float) -> bool:
        """Prune when worse than the median of finished runs at the same evaluation."""
        if i + 1 < self.scfg.prune_after_evals or self.scfg.prune_after_evals == 0:
            return False
        seen = [
            r["errors"][i]
            for r in record.evaluations(self.out)
            if r["status"] == "ok" and len(r["errors"]) > i
        ]
        return len(seen) >= max(1, self.scfg.startup_trials) and error > statistics.median(seen)


def search_base(raw: dict[str, Any], scfg: space.SearchConfig) -> abconfig.Config:
    """The config of the search's runs at the space's low corner (validated already)."""
    steps = abconfig.apply_overrides(copy.deepcopy(raw["train"]), scfg.train)["steps"]
    low = space.overrides(space.corner(scfg.space), scfg.space, steps)
    return abconfig.from_dict(raw["train"], [*scfg.train, *low])
