"""The backend-neutral search space and the `search` section of params.yaml.

A space maps config keys (dotted, as for `--set`) to a parameter:
  {kind: float, low, high, log}    a float, optionally searched on a log scale
  {kind: int, low, high}           an integer, both ends included
  {kind: choice, values: [...]}    one of a list
  {kind: fraction, low, high}      a step count searched as a fraction of `steps`
                                    (schedule knobs, so a result transfers to a longer run)
Propulate gets what it handles well: log10 for log floats, integer indices for choices
(its string genes are corrupted by crossover in 1.2.2), exactly two integer bounds.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from abtrain import config as abconfig


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class _Range(_Section):
    """A parameter searched between `low` and `high` (each kind declares their type)."""

    @model_validator(mode="after")
    def _bounds(self) -> _Range:
        if not self.low < self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        return self


class FloatParam(_Range):
    kind: Literal["float"]
    low: float
    high: float
    log: bool

    @model_validator(mode="after")
    def _positive(self) -> FloatParam:
        if self.log and self.low <= 0:
            raise ValueError("a log-scale range must be positive")
        return self


class IntParam(_Range):
    kind: Literal["int"]
    low: int
    high: int


class ChoiceParam(_Section):
    kind: Literal["choice"]
    values: list[Any] = Field(min_length=1)


class FractionParam(_Range):
    kind: Literal["fraction"]
    low: float = Field(ge=0, le=1)
    high: float = Field(ge=0, le=1)


Param = Annotated[FloatParam | IntParam | ChoiceParam | FractionParam, Field(discriminator="kind")]


class SearchConfig(_Section):
    backend: Literal["propulate", "optuna"]
    ranks: int = Field(ge=1)  # MPI ranks the pipeline's search stage starts
    # the keys of the space whose best values the pipeline's runs take ([]: none); a run's
    # own `set` still wins. The paper profile carries only the schedule, as the paper did
    use_best: list[str]
    ranks_per_worker: int = Field(ge=1)
    evaluations: int = Field(ge=1)  # the budget: individuals or trials, all workers together
    seed: int
    penalty: float  # the error recorded for a crashed, diverged or invalid individual
    islands: int = Field(ge=1)  # propulate
    migration_probability: float = Field(ge=0, le=1)  # propulate
    pollination: bool  # propulate
    # optuna: random trials before TPE proposes (at least 1) and the median pruner acts
    startup_trials: int = Field(ge=0)
    prune_after_evals: int = Field(ge=0)  # evaluations of a run before it may be pruned
    train: list[str]  # overrides of the `train` section for every search run
    space: dict[str, Param] = Field(min_length=1)
    # what the search minimises: `top1`, the validation error of the last evaluation;
    # `tradeoff`, the best validation error and the inter-node bytes per rank together
    # (Optuna: both objectives, no pruning; Propulate: the error under `byte_budget`)
    objective: Literal["top1", "tradeoff"]
    nodes: int = Field(ge=1)  # the nodes a worker's ranks stand for (1: none crosses a node)
    byte_budget: float | None = Field(gt=0)  # Propulate's budget under `tradeoff`, bytes/rank

    @model_validator(mode="after")
    def _carried(self) -> SearchConfig:
        for key in self.use_best:
            if key not in self.space:
                raise ValueError(f"use_best: {key} is not a key of search.space")
            if key == "ab.group_size":  # a 2-rank worker's groups are not a node's
                raise ValueError("use_best: ab.group_size is tied to the search workers' shape")
        if self.ranks_per_worker % self.nodes:
            raise ValueError(
                f"search.nodes={self.nodes} does not divide ranks_per_worker={self.ranks_per_worker}"
            )
        if self.byte_budget is not None and self.objective != "tradeoff":
            raise ValueError("search.byte_budget is a budget of objective `tradeoff` only")
        return self


class SpaceError(ValueError):
    """A bad search space; the message names the key."""


def load(raw: dict[str, Any], overrides: list[str] = ()) -> SearchConfig:
    """Validate the `search` section, and check every key against the training config."""
    import copy

    raw = abconfig.apply_overrides(copy.deepcopy(raw), list(overrides))
    try:
        cfg = SearchConfig.model_validate(raw)
    except ValidationError as err:
        lines = []
        for e in err.errors():
            loc = [str(p) for p in e["loc"] if p not in ("float", "int", "choice", "fraction")]
            lines.append(f"  search.{'.'.join(loc)}: {e['msg']}")
        raise SpaceError("invalid search config:\n" + "\n".join(lines)) from None
    return cfg


def check_exists(space: dict[str, Any], train_raw: dict[str, Any]) -> None:
    """Every key must name a value of the training config."""
    for key in space:
        node = train_raw
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                raise SpaceError(f"search.space.{key}: not a key of the training config")
            node = node[part]


def check_keys(space: dict[str, Any], train_raw: dict[str, Any]) -> None:
    """Every key must name a value of the training config, and every value must fit it."""
    check_exists(space, train_raw)
    for key, param in space.items():
        for value in _extremes(param):
            try:
                abconfig.from_dict(train_raw, [f"{key}={_yaml(value, param, train_raw)}"])
            except abconfig.ConfigError as err:
                raise SpaceError(f"search.space.{key}: value {value!r} is invalid: {err}") from None


def corner(space: dict[str, Any]) -> dict[str, Any]:
    """The point of the space at every parameter's low end (first choice)."""
    return {k: p.values[0] if p.kind == "choice" else p.low for k, p in space.items()}


def low_corner(train_raw: dict[str, Any], scfg: SearchConfig) -> tuple[dict[str, Any], list[str]]:
    """The search's runs at the space's low corner: `train` with `search.train` (raw, not
    validated), and the overrides that put every parameter at its low end."""
    import copy

    base = abconfig.apply_overrides(copy.deepcopy(train_raw), scfg.train)
    return base, overrides(corner(scfg.space), scfg.space, base["steps"])


def _extremes(param) -> list[Any]:
    if param.kind == "choice":
        return list(param.values)
    return [param.low, param.high]


def _yaml(value: Any, param, train_raw: dict[str, Any]) -> str:
    import json

    if param.kind == "fraction":
        value = to_steps(value, train_raw["steps"], floor=SEARCHED_FLOOR)
    return json.dumps(value)


SEARCHED_FLOOR = 1  # the search's runs: every searched knob takes a step at least


def to_steps(fraction: float, steps: int, *, floor: int) -> int:
    """A schedule knob given as a fraction of a run's `steps`, in steps (`abtrain.config.
    to_steps`, the one rule of the config, the search and the matrix).

    Their floors differ: the search's is SEARCHED_FLOOR for every knob, the matrix's runs
    and a config's fractions floor only the AB phase lengths (`abtrain.config.STEP_FLOORS`;
    a warm-up may be empty). That tells only where a fraction rounds to 0 steps: never in
    params.yaml's or the paper profile's runs and searches, but in the paper miniature's
    (runs of 3 steps, a search of 8) and the tests' small searches.
    """
    return abconfig.to_steps(fraction, steps, floor=floor)


def overrides(hp: dict[str, Any], space: dict[str, Any], steps: int) -> list[str]:
    """The `--set` overrides that turn a sampled point into a training config."""
    import json

    out = []
    for key, value in hp.items():
        if space[key].kind == "fraction":
            value = to_steps(value, steps, floor=SEARCHED_FLOOR)
        out.append(f"{key}={json.dumps(value)}")
    return out


# ---------------------------------------------------------------- propulate
def propulate_limits(space: dict[str, Any]) -> dict[str, tuple]:
    limits = {}
    for i, p in enumerate(space.values()):
        name = f"p{i}"  # plain gene names; from_propulate maps them back to config keys
        if p.kind == "float":
            limits[name] = (math.log10(p.low), math.log10(p.high)) if p.log else (p.low, p.high)
        elif p.kind == "fraction":
            limits[name] = (float(p.low), float(p.high))
        elif p.kind == "int":
            limits[name] = (int(p.low), int(p.high))
        else:
            limits[name] = (0, len(p.values) - 1)
    return limits


def from_propulate(ind: Any, space: dict[str, Any]) -> dict[str, Any]:
    hp = {}
    for i, (key, p) in enumerate(space.items()):
        v = ind[f"p{i}"]
        if p.kind == "float":
            hp[key] = float(10**v) if p.log else float(v)
        elif p.kind == "fraction":
            hp[key] = float(v)
        elif p.kind == "int":
            hp[key] = int(v)
        else:
            hp[key] = p.values[int(v)]
    return hp


# ---------------------------------------------------------------- optuna
def suggest(trial: Any, space: dict[str, Any]) -> dict[str, Any]:
    hp = {}
    for key, p in space.items():
        if p.kind == "float":
            hp[key] = trial.suggest_float(key, p.low, p.high, log=p.log)
        elif p.kind == "fraction":
            hp[key] = trial.suggest_float(key, p.low, p.high)
        elif p.kind == "int":
            hp[key] = trial.suggest_int(key, p.low, p.high)
        else:
            hp[key] = trial.suggest_categorical(key, p.values)
    return hp
