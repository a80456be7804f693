"""What the stages share: params.yaml, and the experiment matrix it declares."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from abtrain import config as abconfig

PARAMS = Path("params.yaml")
RUNS = Path("runs")


def params() -> dict[str, Any]:
    return yaml.safe_load(PARAMS.read_text())


@dataclass(frozen=True)
class Run:
    name: str
    method: str
    nodes: int
    ranks_per_node: int
    batch: str  # "local": train.batch_size per rank; "global": reference_global_batch in all
    set: tuple[str, ...] = ()  # further overrides of this run (another model or data set)
    steps: int | None = None  # the run's length; None: experiments.epochs of the data
    source: str | None = None  # where its values come from (the authors' config)

    @property
    def world(self) -> int:
        return self.nodes * self.ranks_per_node


def runs(p: dict[str, Any]) -> dict[str, Run]:
    out = {}
    for name, item in p["experiments"]["runs"].items():
        run = Run(name=name, **{**item, "set": tuple(item.get("set", ()))})
        if run.batch not in ("local", "global"):
            raise ValueError(f"experiments.runs.{name}.batch must be local or global")
        out[name] = run
    return out


def base_config(p: dict[str, Any], run: Run | None = None) -> abconfig.Config:
    return abconfig.from_dict(p["train"], list(run.set) if run else [])


def data_configs(p: dict[str, Any]) -> list[abconfig.ImageData]:
    """Every image data set the pipeline trains on: `train.data`, runs' own, the search's."""
    import copy

    from pydantic import TypeAdapter

    found = [base_config(p, run).data for run in [None, *runs(p).values()]]
    if "search" in p:  # its runs: `train` with `search.train` (the paper's: CIFAR-100)
        raw = abconfig.apply_overrides(copy.deepcopy(p["train"]), p["search"]["train"])
        try:
            found.append(TypeAdapter(abconfig.DataConfig).validate_python(raw["data"]))
        except ValueError as err:
            raise abconfig.ConfigError(f"search.train: data: {err}") from None
    seen = {}
    for data in found:
        if data.name != "synthetic":
            seen[data.prepared] = data
    return list(seen.values())


def train_size(cfg: abconfig.Config) -> int:
    """Training images in the prepared data (generated data: its sample count)."""
    if cfg.data.name == "synthetic":
        return cfg.data.train_samples
    meta = json.loads((Path(cfg.data.prepared) / "meta.json").read_text())
    return sum(meta["counts"]["train"].values())


def run_overrides(
    p: dict[str, Any], run: Run, best: dict[str, Any] | None, size: int | None = None
) -> list[str]:
    """The `--set` overrides that make the `train` section into this run of the matrix.

    Every run sees the same number of samples (experiments.epochs) unless it gives its own
    `steps`; the schedule is the same fraction of each run's steps; the search's best values
    are applied where asked for; a run's own `set` comes last and wins over both (the
    authors' per-run schedules and hyperparameters in the paper profile).
    """
    e, base = p["experiments"], base_config(p, run)
    local = base.batch_size if run.batch == "local" else e["reference_global_batch"] // run.world
    if local < 1:
        raise ValueError(f"experiments.runs.{run.name}: no samples per rank")
    size = size or train_size(base)  # a planner may pass the size of data it doesn't have
    steps = run.steps or max(1, math.floor(e["epochs"] * size / (local * run.world)))
    sets = [
        f"method={run.method}",
        f"batch_size={local}",
        f"steps={steps}",
        f"eval_every={max(1, steps // e['evaluations'])}",
    ]
    fractions = dict(e["schedule"])
    if best is not None:
        from search import space

        s = space.load(p["search"]).space
        for key, value in best["params"].items():
            if key == "ab.group_size":
                continue  # tied to the search workers' shape; here groups are nodes
            if s[key].kind == "fraction":
                fractions[key] = value
            else:
                sets.append(f"{key}={json.dumps(value)}")
    # AB phase lengths need a step at least; warm-ups may be empty
    floor = {k: 1 if k in ("ab.ab_steps", "ab.rebound_steps") else 0 for k in fractions}
    sets += [f"{k}={max(floor[k], round(v * steps))}" for k, v in fractions.items()]
    sets += run.set
    abconfig.from_dict(p["train"], sets)  # fail here, naming the key, not inside torchrun
    return sets
