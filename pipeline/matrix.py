"""The experiment matrix params.yaml declares: its runs, each run's values (the search's
best, the overrides, their provenance), the data each needs."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from abtrain import config as abconfig
from abtrain.files import read_record
from pipeline.stage import DATA_COUNTS, SEARCHES
from search import space


@dataclass(frozen=True)
class MatrixRun:
    """One run of the experiment matrix (`experiments.runs` in params.yaml): what it trains
    and at which scale; its values come from `resolve`."""

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


def runs(p: dict[str, Any]) -> dict[str, MatrixRun]:
    out = {}
    for name, item in p["experiments"]["runs"].items():
        run = MatrixRun(name=name, **{**item, "set": tuple(item.get("set", ()))})
        if run.batch not in ("local", "global"):
            raise ValueError(f"experiments.runs.{name}.batch must be local or global")
        out[name] = run
    return out


def run_of(p: dict[str, Any], method: str, nodes: int, ranks_per_node: int) -> MatrixRun:
    """The matrix's local-batch run of `method` on nodes x ranks_per_node (or, lacking one,
    on as many ranks): the run a benchmark or study of that method trains as."""
    world = nodes * ranks_per_node
    found = [
        r
        for r in runs(p).values()
        if r.method == method and r.world == world and r.batch == "local" and not r.steps
    ]
    if not found:
        raise abconfig.ConfigError(
            f"experiments.runs has no local-batch run of {method} on {world} ranks"
        )
    return min(found, key=lambda r: (r.nodes, r.ranks_per_node) != (nodes, ranks_per_node))


# The values every run derives from the matrix: experiments.set can't name them.
DERIVED = {
    "method": "experiments.runs.NAME.method",
    "batch_size": "train.batch_size, experiments.runs.NAME.batch or reference_global_batch",
    "steps": "experiments.epochs or experiments.runs.NAME.steps",
    "eval_every": "experiments.evaluations",
}


def experiment_sets(p: dict[str, Any]) -> list[str]:
    """`experiments.set`: overrides of `train` for every run of the matrix, applied last.

    They are the experiment's own values (`dvc exp run -S 'experiments.set=[...]'`), so they
    win over the search's best and a run's own `set` alike; the searches never see them.
    """
    sets = p["experiments"].get("set") or []
    if not isinstance(sets, list) or not all(isinstance(s, str) and "=" in s for s in sets):
        raise abconfig.ConfigError(
            f"experiments.set must be a list of 'key=value' strings, not {sets!r}"
        )
    for s in sets:
        key = s.split("=", 1)[0].strip()
        if key in DERIVED:
            raise abconfig.ConfigError(
                f"experiments.set: {key} is derived for each run from {DERIVED[key]}; set it there"
            )
    return list(sets)


def base_config(p: dict[str, Any], run: MatrixRun | None = None) -> abconfig.Config:
    """`train` with the run's own `set` and `experiments.set`: the model and data it trains."""
    extra = [f"method={run.method}", *run.set, *experiment_sets(p)] if run else []
    return abconfig.from_dict(p["train"], extra)


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
    """Training images in the prepared data (generated data: its sample count); without the
    prepared folder, the count the prepare stage committed (DATA_COUNTS)."""
    if cfg.data.name == "synthetic":
        return cfg.data.train_samples
    meta = Path(cfg.data.prepared) / "meta.json"
    if meta.exists():
        return sum(json.loads(meta.read_text())["counts"]["train"].values())
    counts = read_record(DATA_COUNTS, remake="dvc repro prepare") if DATA_COUNTS.exists() else {}
    if cfg.data.prepared not in counts:
        raise abconfig.ConfigError(
            f"data.prepared: {cfg.data.prepared} is not prepared and {DATA_COUNTS} has no count "
            "of it: run the prepare stage (dvc repro prepare)"
        )
    return counts[cfg.data.prepared]["train"]


@dataclass(frozen=True)
class Override:
    """One `--set key=value` of a run and where its value comes from."""

    key: str
    value: str
    source: str

    @property
    def text(self) -> str:
        return f"{self.key}={self.value}"


# The authors' "no groups" runs (every rank trains B) as each committed version of their code
# ran them (../shared/reference/authors-code.md 3 and 11.1); `experiments.nogroups` names the
# one every ab_nogroups run of the matrix follows. A run's own `set` still wins (the VGG16
# config's node groups).
NOGROUPS = {
    # HEAD, the paper's description: one group of the world, A = UΣ^½ and B = Σ^½Vᵀ, the
    # first and the last weight layer (conv1/fc, patch_embed/head) full rank, B averaged
    "c23240c": lambda world: [
        "ab.split_sigma=true",
        "ab.full_rank_layers=null",
        "ab.group_size=null",
        "ab.sync_mode=with_stale",
    ],
    # the scaling runs' code: two half-world groups training B = ΣVᵀ (A = U), every layer
    # factorised, and a sync that averaged nothing (a misspelt parameter name), so the world
    # DDP wrap after it gave every rank rank 0's W
    "c3dbc10": lambda world: [
        "ab.split_sigma=false",
        "ab.full_rank_layers=[]",
        f"ab.group_size={max(1, world // 2)}",
        "ab.sync_mode=rank0",
    ],
}


def nogroups_sets(p: dict[str, Any], run: MatrixRun) -> list[str]:
    """The overrides of an ab_nogroups run from the version `experiments.nogroups` names."""
    version = p["experiments"].get("nogroups")
    if version not in NOGROUPS:
        raise abconfig.ConfigError(
            f"experiments.nogroups: {version!r} is not a version of the authors' code this "
            f"reproduces ({', '.join(NOGROUPS)})"
        )
    return NOGROUPS[version](run.world) if run.method == "ab_nogroups" else []


# The fewest steps a schedule fraction becomes in a run of the matrix: a config's own rule
# (`abtrain.config.STEP_FLOORS`; `space.to_steps` says where the search's differs)
RUN_FLOORS = {".".join(key): floor for key, floor in abconfig.STEP_FLOORS.items()}


def best_config(p: dict) -> dict | None:
    """The search's best the runs take values from (search.use_best), or None."""
    if not p["search"]["use_best"]:
        return None
    path = SEARCHES / p["search"]["backend"] / "best.json"
    if not path.exists():
        raise SystemExit(
            f"search.use_best names keys but {path} does not exist: run the search stage "
            f"(dvc repro search@{p['search']['backend']})"
        )
    return read_record(path, ("params", "overrides"), f"dvc repro search@{p['search']['backend']}")


def seeds(p: dict[str, Any]) -> list[int]:
    """The seeds each run of the matrix trains at: `train.seed` and the next
    `experiments.seeds` - 1."""
    count, first = p["experiments"]["seeds"], p["train"]["seed"]
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise abconfig.ConfigError(f"experiments.seeds must be a count of 1 or more, not {count!r}")
    return [first + i for i in range(count)]


def resolve(
    p: dict[str, Any], run: MatrixRun, best: dict[str, Any] | None, size: int | None = None
) -> list[Override]:
    """The overrides that make the `train` section into this run of the matrix, in order
    (a later one wins), each with its source.

    Every run sees the same number of samples (experiments.epochs) unless it gives its own
    `steps`; the schedule is the same fraction of each run's steps; the search's best values
    for the keys `search.use_best` names (they replace `train`'s and experiments.schedule's);
    an ab_nogroups run's version of the authors' code (`experiments.nogroups`); then a run's
    own `set` (the authors' per-run schedules and hyperparameters in the paper
    profile); then `experiments.set`, the experiment's explicit values, which win over all.
    """
    e, base = p["experiments"], base_config(p, run)
    local = base.batch_size if run.batch == "local" else e["reference_global_batch"] // run.world
    if local < 1:
        raise abconfig.ConfigError(
            f"experiments.runs.{run.name}: reference_global_batch="
            f"{e['reference_global_batch']} leaves no sample per rank on {run.world} ranks"
        )
    size = size or train_size(base)  # a planner may pass the size of data it doesn't have
    steps = run.steps or math.floor(e["epochs"] * size / (local * run.world))
    if steps < 1:
        raise abconfig.ConfigError(
            f"experiments.epochs={e['epochs']:g} is no whole step of run {run.name} "
            f"({size} training samples, {local * run.world} a step): at least "
            f"{local * run.world / size:.3g}, or give the run its own steps"
        )
    matrix = f"experiments.runs.{run.name}"
    out = [
        Override("method", run.method, matrix),
        Override("batch_size", str(local), f"{matrix}.batch={run.batch}"),
        Override("steps", str(steps), f"{matrix}.steps" if run.steps else "experiments.epochs"),
        Override("eval_every", str(max(1, steps // e["evaluations"])), "experiments.evaluations"),
    ]
    fractions = {k: (v, "experiments.schedule") for k, v in e["schedule"].items()}
    if best is not None:
        s = space.load(p["search"]).space
        origin = f"search best ({best.get('backend', p['search']['backend'])})"
        for key, value in best["params"].items():
            if key not in p["search"]["use_best"]:
                continue  # the profile names, per key, what the search may change
            if s[key].kind == "fraction":
                fractions[key] = (value, origin)
            else:
                out.append(Override(key, json.dumps(value), origin))
    for k, (v, origin) in fractions.items():
        value = space.to_steps(v, steps, floor=RUN_FLOORS.get(k, 0))
        out.append(Override(k, str(value), f"{origin}: {v:g} of steps"))
    version = f"experiments.nogroups ({p['experiments'].get('nogroups')})"
    for text in nogroups_sets(p, run):
        key, _, value = text.partition("=")
        out.append(Override(key, value, version))
    for origin, texts in ((f"{matrix}.set", run.set), ("experiments.set", experiment_sets(p))):
        for text in texts:
            key, _, value = text.partition("=")
            out.append(Override(key.strip(), value, origin))
    # fail here, naming the key, not inside torchrun
    abconfig.from_dict(p["train"], [o.text for o in out])
    return out


def run_overrides(
    p: dict[str, Any], run: MatrixRun, best: dict[str, Any] | None, size: int | None = None
) -> list[str]:
    """The `--set` overrides of this run of the matrix (see `resolve`)."""
    return [o.text for o in resolve(p, run, best, size)]


def provenance(p: dict[str, Any], overrides: list[Override]) -> list[str]:
    """One line per value the run doesn't take from `train`: its source, and what it replaced
    (so a value that lost to a later source shows where it went). Left out, since they change
    nothing the run does: a value equal to all it replaces, and the settings of a part the
    run's method lacks (ab.* without AB phases, powersgd.* without PowerSGD), counted in one
    line. Only the printout: the run's overrides are `overrides`, whole."""
    from abtrain.method.methods import unread_sections

    lines, seen = [], {}
    for o in overrides:
        seen.setdefault(o.key, []).append(o)
    method = seen["method"][-1].value if "method" in seen else p["train"]["method"]
    unused = unread_sections(method)
    skipped: dict[str, int] = {}
    for key, chain in seen.items():
        *lost, won = chain
        section = key.split(".", 1)[0]
        if "." in key and unused.get(section):
            skipped[section] = skipped.get(section, 0) + 1
            continue
        node: Any = p["train"]
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        value = _json(_read(won.value))
        if all(_json(_read(o.value)) == value for o in lost) and _json(node) == value:
            continue
        replaced = [f"{o.value} from {o.source}" for o in reversed(lost)]
        replaced.append(f"{json.dumps(node)} from train")
        lines.append(f"{key}={won.value}  <- {won.source}; replaces {', '.join(replaced)}")
    for section, n in skipped.items():
        lines.append(f"{section}.*: {n} not shown ({method} {unused[section]})")
    return lines


def _read(text: str) -> Any:
    """An override's value as the config reads it."""
    return abconfig.parse_override(f"k={text}")[1]


def _json(value: Any) -> str:
    """For comparing values: 1 and 1.0, or 1 and true, count as different (print when unsure)."""
    return json.dumps(value, sort_keys=True)


# what the benchmark measures, not what is trained: evaluations often enough to time the
# target, and no checkpoint writes inside the timed loop
# what the network benchmark changes in the matrix's runs: evaluations often enough to
# read a time to accuracy, no checkpoints to time
BENCHMARK_SETS = ("eval_every=10", "checkpoint_every=0")


def matrix_sets(
    params: dict[str, Any], nodes: int, ranks: int, methods: list[str]
) -> tuple[list[str], dict[str, list[str]]]:
    """The overrides of each method's run in the matrix at this world size (a local-batch
    one, this shape's if the matrix has it): those every method shares, and each one's own."""
    best, each = best_config(params), {}
    for method in methods:
        try:
            run = run_of(params, method, nodes, ranks)
        except abconfig.ConfigError as err:
            raise SystemExit(f"bench.network: {err}; add one, or pass --no-matrix") from None
        sets = run_overrides(params, run, best)
        each[method] = last_of_each_key([s for s in sets if not s.startswith("method=")])
    shared = [s for s in next(iter(each.values())) if all(s in v for v in each.values())]
    own = {m: [s for s in v if s not in shared] for m, v in each.items()}
    return shared, {m: v for m, v in own.items() if v}


def last_of_each_key(sets: list[str]) -> list[str]:
    """KEY=VALUE overrides with each key's earlier values dropped: the same settings,
    recorded once (the defaults, then what --set changed or added)."""
    out: dict[str, str] = {}
    for text in sets:
        key = text.partition("=")[0].strip()
        out.pop(key, None)
        out[key] = text
    return list(out.values())
