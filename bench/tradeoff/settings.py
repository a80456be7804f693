"""The study's settings: the `tradeoff` section of params.yaml, validated, and what each
search is given from it (its params file, its folder)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from abtrain import config as abconfig
from abtrain.files import read_record_rows
from search import space as searchspace

RUNS_DIR = Path("runs/tradeoff")


OUT = Path("reports/tradeoff")


BACKENDS = ("optuna", "propulate")


# a round of evaluations (every worker one, side by side) of the committed search, the
# estimate's unit; without that record, about what one took here
ROUND_SECONDS = 90.0


class TradeoffConfig(BaseModel):
    """params.yaml's `tradeoff` section (bench.tradeoff's settings)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    methods: list[abconfig.Method] = Field(min_length=1)  # ddp first: the budgets' unit
    budgets: list[float] = Field(min_length=1)  # fractions of DDP's inter-node bytes
    seeds: int = Field(ge=1)  # the front points under each budget, at this many other seeds
    front_points: int = Field(ge=1)  # how many of a method's front points under a budget
    long_steps: int = Field(ge=0)  # the chosen points again at this length (0: none)
    ranks: int = Field(ge=1)  # MPI ranks of each search
    nodes: int = Field(ge=1)  # the nodes a worker's ranks stand for
    # Optuna's random start-up trials before TPE proposes: at most a third of a search's
    # trials (`startup_of`), so that most of a search is TPE's own
    startup: int = Field(ge=1)
    evaluations: dict[
        str, dict[str, int]
    ]  # backend -> method -> evaluations (propulate: each budget)
    train: list[str]  # overrides of `train` for every run of the study
    spaces: dict[str, dict[str, searchspace.Param]]  # method -> its knobs

    @model_validator(mode="after")
    def _consistent(self) -> TradeoffConfig:
        if self.methods[0] != "ddp":
            raise ValueError("tradeoff.methods: ddp comes first (the budgets are its bytes)")
        for b in self.budgets:
            if not 0 < b <= 1:
                raise ValueError(f"tradeoff.budgets: {b} is not a fraction of DDP's bytes")
        for backend, per in self.evaluations.items():
            if backend not in BACKENDS:
                raise ValueError(f"tradeoff.evaluations.{backend}: not a backend")
            for m in per:
                if m not in self.methods:
                    raise ValueError(f"tradeoff.evaluations.{backend}.{m}: not in tradeoff.methods")
        for m in self.methods:
            if m not in self.spaces:
                raise ValueError(f"tradeoff.spaces: no space for method {m}")
        return self


def round_seconds() -> float:
    """The median evaluation of the committed Optuna search (its workers side by side)."""
    rows = Path("results/search/optuna/evaluations.jsonl")
    if not rows.exists():
        return ROUND_SECONDS
    took = [r["t_end"] - r["t_start"] for r in read_record_rows(rows) if r["status"] == "ok"]
    return statistics.median(took) if took else ROUND_SECONDS


def settings(p: dict[str, Any]) -> TradeoffConfig:
    if "tradeoff" not in p:
        raise SystemExit("params.yaml has no `tradeoff` section: the study's settings")
    try:
        return TradeoffConfig.model_validate(p["tradeoff"])
    except ValueError as err:
        raise SystemExit(f"params.yaml, section tradeoff: {err}") from None


# ---------------------------------------------------------------- the searches' settings
def search_params(
    p: dict[str, Any],
    t: TradeoffConfig,
    method: str,
    backend: str,
    share: float | None,
    ddp: float | None,
) -> dict[str, Any]:
    """params.yaml as one of the study's searches reads it: the method's space, objective
    `tradeoff`, the study's train overrides, its budget (`share` of DDP's `ddp` bytes per
    rank); nothing carried to the matrix."""
    q = json.loads(json.dumps(p))
    s = q["search"]
    # each search its own seed: two with one seed would propose the same first points
    order = [(m, b, x) for m in t.methods for b, x in searches_of(t, m)]
    budget = share * ddp if share is not None and ddp is not None else None
    n = t.evaluations[backend][method]
    s.update(
        startup_trials=startup_of(t, n),
        seed=s["seed"] + order.index((method, backend, share)),
        backend=backend,
        ranks=t.ranks,
        use_best=[],
        evaluations=n,
        objective="tradeoff",
        nodes=t.nodes,
        byte_budget=budget,
        train=[*t.train, f"method={method}"],
        space={k: v.model_dump() for k, v in t.spaces[method].items()},
    )
    return q


def startup_of(t: TradeoffConfig, trials: int) -> int:
    """The random start-up of an Optuna search of `trials`: `tradeoff.startup`, at most a
    third of them (at least one)."""
    return max(1, min(t.startup, trials // 3))


def ddp_bytes(runs_dir: Path) -> float:
    """DDP's inter-node bytes per rank, from its Optuna search (every DDP run of the same
    steps sends the same)."""
    rows = read_record_rows(runs_dir / "ddp" / "optuna" / "evaluations.jsonl")
    sent = [r["inter_node_bytes"] for r in rows if r.get("inter_node_bytes")]
    if not sent:
        raise SystemExit(f"{runs_dir}/ddp/optuna holds no finished DDP run: run it first")
    return statistics.median(sent)


def folder_of(runs_dir: Path, method: str, backend: str, budget: float | None) -> Path:
    return runs_dir / method / (backend if budget is None else f"{backend}-b{budget:g}")


def searches_of(t: TradeoffConfig, method: str) -> list[tuple[str, float | None]]:
    """(backend, budget) of each of the method's searches, in the order they run."""
    out: list[tuple[str, float | None]] = []
    if t.evaluations.get("optuna", {}).get(method):
        out.append(("optuna", None))
    if t.evaluations.get("propulate", {}).get(method):
        budgets = [None] if method == "ddp" else list(t.budgets)
        out += [("propulate", b) for b in budgets]
    return out
