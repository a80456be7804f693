"""Where a run stands, besides its weights: what a checkpoint keeps of the loop.

Its size grows with evaluations and factorisations, never with steps: the per-step log
goes to `train_log.csv` as it is made, and the loss window since the last evaluation is
kept as running sums.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, fields
from typing import Any

# Where a step's time goes; `comm` is what the step waited for (syncs, and the part of the
# gradient all-reduce that the backward pass did not hide), so the parts add up.
TIME_PARTS = ("data", "compute", "comm", "svd", "wrap", "eval", "checkpoint")


@dataclass
class RunState:
    """The loop's record; the phase and the factorisations are the method's
    (`ABTraining.state_dict`)."""

    step: int = 0
    pending_eval: bool = False
    evals: list[dict[str, Any]] = field(default_factory=list)
    elapsed: float = 0.0  # training seconds so far, across restarts
    window: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])  # loss, top-1, n
    last_loss: float | None = None
    run_id: str = ""
    stopped_early: dict[str, Any] | None = None  # the rule and the step, if one stopped it
    times: dict[str, dict[str, float]] = field(
        default_factory=lambda: defaultdict(lambda: dict.fromkeys(("steps", *TIME_PARTS), 0.0))
    )

    def add_time(self, phase: str, part: str, seconds: float) -> None:
        self.times[phase][part] += seconds

    def time_summary(self) -> dict[str, Any]:
        """Seconds per phase and part, and each part's share of all of them."""
        by_phase = {k: dict(v) for k, v in sorted(self.times.items())}
        total = sum(v[p] for v in by_phase.values() for p in TIME_PARTS) or 1.0
        share = {p: sum(v[p] for v in by_phase.values()) / total for p in TIME_PARTS}
        return dict(by_phase=by_phase, share=share)

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["times"] = {k: dict(v) for k, v in self.times.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunState:
        state = cls(**d)
        times = cls().times
        times.update(d["times"])
        state.times = times
        return state
