"""What params.yaml's `experiments` section may hold, checked as `train` is: every key known,
every value in range, before any stage starts a process. An error names the key and, inside
`experiments.runs`, the run (`experiments.runs.ab-2x2.epoch: unknown key`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from abtrain import config as abconfig

SCHEDULE = {".".join(key) for key in abconfig.SCHEDULE_KEYS}


class _Strict(BaseModel):
    # as train's sections: no unknown key, no .inf or .nan, no "2" for 2
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False)


class RunEntry(_Strict):
    """One run of the matrix (`pipeline.matrix.MatrixRun` is what the stages use)."""

    method: abconfig.Method
    nodes: int = Field(ge=1)
    ranks_per_node: int = Field(ge=1)
    batch: Literal["local", "global"]  # train.batch_size per rank, or reference_global_batch
    set: list[str] = []
    steps: int | None = Field(default=None, ge=1)  # None: experiments.epochs of the data
    source: str | None = None

    @field_validator("set")
    @classmethod
    def _pairs(cls, sets: list[str]) -> list[str]:
        for s in sets:
            if "=" not in s:
                raise ValueError(f"{s!r} is not key=value")
        return sets


class Slurm(_Strict):
    partition: str | None = None
    account: str | None = None
    time: str | int | float  # pipeline.slurm.checked refuses a number YAML made of 12:00:00
    gpus_per_node: int = Field(ge=0)
    cpus_per_task: int = Field(ge=1)
    stop_before_s: int = Field(ge=0)
    max_restarts: int = Field(ge=0)
    search_nodes: int = Field(ge=1)
    setup: str | None = None
    env: dict[str, str | int | float] = {}


class Experiments(_Strict):
    launcher: Literal["local", "slurm"]
    slurm: Slurm
    epochs: float = Field(gt=0)  # passes over the training data; a run's own steps win
    seeds: int = Field(ge=1)
    evaluations: int = Field(ge=1)
    reference_global_batch: int = Field(ge=1)
    set: list[str] = []
    nogroups: str  # pipeline.matrix.NOGROUPS names the versions
    schedule: dict[str, float]
    runs: dict[str, RunEntry] = Field(min_length=1)

    @field_validator("schedule")
    @classmethod
    def _fractions(cls, schedule: dict[str, float]) -> dict[str, float]:
        for key, value in schedule.items():
            if key not in SCHEDULE:
                raise ValueError(f"{key} is not a schedule key ({', '.join(sorted(SCHEDULE))})")
            if not 0 <= value <= 1:
                raise ValueError(f"{key}: {value} is not a fraction of the steps (0 to 1)")
        return schedule


def check(p: dict[str, Any], where: str = "params.yaml") -> Experiments:
    """The `experiments` section, validated; ConfigError names each bad key in one line."""
    raw = p.get("experiments")
    if not isinstance(raw, dict):
        raise abconfig.ConfigError(f"{where}: experiments: a mapping is missing")
    try:
        return Experiments(**raw)
    except ValidationError as err:
        lines = []
        for e in err.errors():
            key = ".".join(["experiments", *(str(part) for part in e["loc"])])
            msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"]
            if e["type"] == "extra_forbidden" and e["loc"][:1] == ("runs",):
                msg += f" (a run takes {', '.join(RunEntry.model_fields)})"
            lines.append(f"{key}: {msg}")
        raise abconfig.ConfigError(f"{where}: " + "; ".join(lines)) from None
