"""Accuracy against inter-node bytes: each method's own knobs searched on both backends for
the two objectives together, each method's front, and seeds on the front at the budgets
params.yaml names (section `tradeoff`).

    python -m bench.tradeoff --dry-run        # the searches and seed runs, their time
    python -m bench.tradeoff                  # run what is not finished (resumes)
    python -m bench.tradeoff --report-only    # rebuild reports/tradeoff from runs/tradeoff
    python -m bench.tradeoff --render         # page, figure, verdict from points.json

A study on bench.study's skeleton, not part of `dvc repro` or CI (about 32 min here). For
each method, in this order:
- Optuna's search of the method's space (`tradeoff.spaces`) under objective `tradeoff`:
  both objectives, the best validation error and the inter-node bytes per rank, natively
  (multi-objective TPE, no pruning);
- Propulate's, which minimises one number: the error under a byte budget (each budget of
  `tradeoff.budgets`, as a fraction of DDP's bytes, a search of its own; over the budget
  the error plus 100 points per budget's worth sent: search.context.tradeoff_loss). DDP's
  bytes come from its Optuna search, which runs first; DDP's own bytes are fixed by the
  schedule, so its Propulate search has no budget.
Every search is `python -m search` under mpirun on `tradeoff.ranks` ranks (workers of
search.ranks_per_worker ranks, standing for `tradeoff.nodes` nodes, so the ledger counts
what would cross a node), its runs `train` with `tradeoff.train` and the point's values.
Then, at each budget, each method's best point within it is trained again at the seeds
after the search's own (`python -m abtrain.launch`, the same shape): its top-1 is the mean
over `tradeoff.seeds` seeds.

Writes reports/tradeoff/points.json (one record per evaluated configuration), README.md
and tradeoff.png; the verdict leads the README's headline. MLflow: the study as a parent
run, each point a nested run, the figure and the record as artifacts.
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from abtrain import config as abconfig
from abtrain.files import atomic_write_text, read_record, read_record_rows
from abtrain.progress import duration
from bench import study
from bench.study import Run
from pipeline.common import parser, stage
from pipeline.report.markdown import span, table
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
    seeds: int = Field(ge=1)  # each method's best point under each budget, at this many
    ranks: int = Field(ge=1)  # MPI ranks of each search
    nodes: int = Field(ge=1)  # the nodes a worker's ranks stand for
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
    s.update(
        seed=s["seed"] + order.index((method, backend, share)),
        backend=backend,
        ranks=t.ranks,
        use_best=[],
        evaluations=t.evaluations[backend][method],
        objective="tradeoff",
        nodes=t.nodes,
        byte_budget=budget,
        train=[*t.train, f"method={method}"],
        space={k: v.model_dump() for k, v in t.spaces[method].items()},
    )
    return q


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


# ---------------------------------------------------------------- the points
def points_of(runs_dir: Path, t: TradeoffConfig) -> list[dict[str, Any]]:
    """Every finished evaluation of every search, as a point: method, backend, budget,
    params, the seed-0 top-1, bytes, compression, kept rank."""
    out = []
    for m in t.methods:
        for backend, budget in searches_of(t, m):
            folder = folder_of(runs_dir, m, backend, budget)
            rows = folder / "evaluations.jsonl"
            if not (folder / "best.json").exists():
                continue
            for r in read_record_rows(rows):
                if r["status"] != "ok" or r.get("inter_node_bytes") is None:
                    continue
                out.append(
                    dict(
                        method=m,
                        backend=backend,
                        budget=budget,
                        search=str(folder),
                        id=r["id"],
                        params=r["params"],
                        overrides=r["overrides"],
                        top1=[100.0 - min(r["errors"])],
                        inter_node_bytes_per_rank=r["inter_node_bytes"],
                        compression=r["compression"],
                        kept_rank=r["kept_rank"],
                    )
                )
    return out


def searches_of(t: TradeoffConfig, method: str) -> list[tuple[str, float | None]]:
    """(backend, budget) of each of the method's searches, in the order they run."""
    out: list[tuple[str, float | None]] = []
    if t.evaluations.get("optuna", {}).get(method):
        out.append(("optuna", None))
    if t.evaluations.get("propulate", {}).get(method):
        budgets = [None] if method == "ddp" else list(t.budgets)
        out += [("propulate", b) for b in budgets]
    return out


def key_of(point: dict[str, Any]) -> str:
    """A point's identity across searches: its method and the values it trains with."""
    return point["method"] + " " + " ".join(sorted(point["overrides"]))


def on_front(points: list[dict[str, Any]]) -> list[bool]:
    """Each point's place on its method's Pareto front: no point of the same method has
    at least its top-1 with at most its bytes, and is better in one."""

    def beats(a: dict[str, Any], b: dict[str, Any]) -> bool:
        ta, tb = a["best_top1"], b["best_top1"]
        ba, bb = a["inter_node_bytes_per_rank"], b["inter_node_bytes_per_rank"]
        return ta >= tb and ba <= bb and (ta > tb or ba < bb)

    return [
        not any(q is not p and q["method"] == p["method"] and beats(q, p) for q in points)
        for p in points
    ]


def best_within(points: list[dict[str, Any]], method: str, share: float) -> dict[str, Any] | None:
    """The method's point of best top-1 within `share` of DDP's bytes."""
    inside = [p for p in points if p["method"] == method and p["bytes_vs_ddp"] <= share + 1e-9]
    return max(inside, key=lambda p: p["best_top1"], default=None)


def finish(points: list[dict[str, Any]], ddp: float, steps: int) -> list[dict[str, Any]]:
    """Each point's figures from its seeds, its share of DDP's bytes, its front."""
    for p in points:
        p["best_top1"] = statistics.fmean(p["top1"])
        p["best_top1_sd"] = statistics.stdev(p["top1"]) if len(p["top1"]) > 1 else None
        p["bytes_vs_ddp"] = p["inter_node_bytes_per_rank"] / ddp
        p["steps"] = steps
    for p, front in zip(points, on_front(points)):
        p["front"] = front
    return points


# ---------------------------------------------------------------- the study
@dataclass
class Tradeoff(study.Study):
    p: dict[str, Any] | None = None
    runs_dir: Path = RUNS_DIR

    name = "tradeoff"
    record = "points.json"
    keys = ("points", "budgets", "ddp_bytes", "model")
    figure_file = "tradeoff.png"
    basis = "each round of evaluations as long as the committed search's, each seed run half that"

    @property
    def t(self) -> TradeoffConfig:
        return settings(self.p)

    def plan(self) -> list[Run]:
        t, p = self.t, self.p
        workers = t.ranks // p["search"]["ranks_per_worker"]
        unit = round_seconds()  # read once: the committed search's record
        out = []
        for m in t.methods:
            for backend, budget in searches_of(t, m):
                n = t.evaluations[backend][m]
                rounds = math.ceil(n / workers)
                label = f"{m}: {backend}" + (f" under {budget:g} of DDP's bytes" if budget else "")
                out.append(
                    Run(
                        name=label,
                        folder=folder_of(self.runs_dir, m, backend, budget),
                        seconds=study.LAUNCH_SECONDS + rounds * unit,
                        done="best.json",
                        launch=self._search(m, backend, budget),
                        info=dict(kind="search"),
                    )
                )
        for m in t.methods:
            budgets = [1.0] if m == "ddp" else list(t.budgets)
            for b in budgets:
                for seed in range(1, t.seeds):
                    out.append(
                        Run(
                            name=f"{m}'s best within {b:g} of DDP's bytes, seed +{seed}",
                            folder=self.runs_dir / "seeds" / f"{m}-b{b:g}-s{seed}",
                            nodes=t.nodes,
                            ranks_per_node=p["search"]["ranks_per_worker"] // t.nodes,
                            seconds=study.LAUNCH_SECONDS + unit / 2,
                            launch=self._seed(m, b, seed),
                            info=dict(kind="seed", method=m, budget=b, seed=seed),
                        )
                    )
        return out

    def _search(self, method: str, backend: str, budget: float | None):
        def launch(run: Run) -> None:
            from pipeline.search import run_mpirun

            ddp = ddp_bytes(self.runs_dir) if budget else None
            q = search_params(self.p, self.t, method, backend, budget, ddp)
            run.folder.mkdir(parents=True, exist_ok=True)
            config = run.folder.parent / f"{run.folder.name}.params.yaml"
            atomic_write_text(config, yaml.safe_dump(q, sort_keys=False))
            args = ["--config", str(config), "--out", str(run.folder)]
            if (run.folder / "search.json").exists():
                args.append("--resume")
            if run_mpirun(self.t.ranks, args):
                raise SystemExit(f"[bench.tradeoff] error: the search in {run.folder} failed")

        return launch

    def _seed(self, method: str, budget: float, seed: int):
        def launch(run: Run) -> None:
            points = self._points()
            best = best_within(points, method, budget)
            if best is None:  # no point of the method within the budget: nothing to seed
                run.folder.mkdir(parents=True, exist_ok=True)
                atomic_write_text(run.folder / "point.json", json.dumps(dict(point=None)))
                atomic_write_text(run.folder / run.done, "{}\n")
                return
            point = dict(point=key_of(best), search=best["search"], id=best["id"])
            same = [
                f
                for f in (self.runs_dir / "seeds").glob(f"{method}-b*-s{seed}")
                if (f / run.done).exists()
                and f != run.folder
                and json.loads((f / "point.json").read_text()).get("point") == point["point"]
            ]
            if same:  # the same point at another budget: trained once
                shutil.rmtree(run.folder, ignore_errors=True)
                shutil.copytree(same[0], run.folder)
                return
            base = self.p["train"]["seed"]
            run.sets = [
                *self.t.train,
                f"method={method}",
                *best["overrides"],
                f"seed={base + seed}",
                "tracking.enabled=false",
            ]
            run.folder.mkdir(parents=True, exist_ok=True)
            atomic_write_text(run.folder / "point.json", json.dumps(point))
            study.start(run)

        return launch

    def _points(self) -> list[dict[str, Any]]:
        pts = points_of(self.runs_dir, self.t)
        ddp = ddp_bytes(self.runs_dir)
        return finish(pts, ddp, self._steps())

    def _decay(self, point: dict[str, Any]) -> float:
        """What decay alone leaves of a singular value over the point's run
        (abtrain.schedule.decay_left)."""
        from abtrain.schedule import decay_left

        cfg = abconfig.from_dict(
            self.p["train"], [*self.t.train, f"method={point['method']}", *point["overrides"]]
        )
        return decay_left(cfg)

    def _steps(self) -> int:
        return abconfig.from_dict(self.p["train"], list(self.t.train)).steps

    # ------------------------------------------------------------ the record
    def aggregate(self, runs: list[Run]) -> dict[str, Any]:
        t = self.t
        points = points_of(self.runs_dir, t)
        by_key = {}
        for p in points:  # a point two searches both found is one configuration
            by_key.setdefault(key_of(p), p)
        points = list(by_key.values())
        for r in runs:
            if r["kind"] != "seed" or not (r.folder / r.done).exists():
                continue
            chosen = json.loads((r.folder / "point.json").read_text()).get("point")
            if chosen is None or chosen not in by_key:
                continue
            top1 = read_record(r.folder / "summary.json", ("val_top1",))["val_top1"]["best"]
            picked = by_key[chosen].setdefault("chosen_at", [])
            if r["budget"] not in picked:
                picked.append(r["budget"])
            seeds = by_key[chosen].setdefault("seed_offsets", [0])
            if r["seed"] not in seeds:
                seeds.append(r["seed"])
                by_key[chosen]["top1"].append(top1)
        base = self.p["train"]["seed"]
        for p in points:
            p["seeds"] = [base + s for s in p.pop("seed_offsets", [0])]
        for p in points:
            p["decay"] = self._decay(p)
        ddp = ddp_bytes(self.runs_dir)
        points = finish(points, ddp, self._steps())
        took = [
            float((r.folder / "launch_seconds.txt").read_text())
            for r in runs
            if (r.folder / "launch_seconds.txt").exists()
        ]
        return dict(
            made=study.stamp(),
            command=self.command,
            seconds=sum(took),
            model=self.p["train"]["model"],  # the report names a study of another model apart
            ranks_per_node=self.p["search"]["ranks_per_worker"] // t.nodes,
            settings=t.model_dump(mode="json"),
            ddp_bytes=ddp,
            budgets=list(t.budgets),
            points=points,
        )

    def refresh(self, data: dict[str, Any]) -> dict[str, Any]:
        data["points"] = finish(data["points"], data["ddp_bytes"], data["points"][0]["steps"])
        return data

    # ------------------------------------------------------------ what it says
    def sentence(self, data: dict[str, Any]) -> str:
        return verdict(data)

    def figure(self, data: dict[str, Any], path: Path) -> None:
        draw(data, path)

    def page(self, data: dict[str, Any]) -> str:
        return page(data)


def low_rank(pts: list[dict[str, Any]], steps: int) -> list[str]:
    """Which AB points cut ranks, by method and init, and what tells them apart: the
    cutoff, the learning rate, and what decay alone would have left."""
    ab = [p for p in pts if p["method"] in ("ab", "ab_powersgd")]
    if not ab:
        return ["No AB point finished."]
    cut = [p for p in ab if p["compression"] > 1.0]
    kept = [p for p in ab if p["compression"] <= 1.0]
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for p in ab:
        init = p["params"].get("model.init", "the profile's init (not searched)")
        groups.setdefault((p["method"], init), []).append(p)
    rows = [
        [m, init, f"{sum(p['compression'] > 1.0 for p in g)} of {len(g)}"]
        + [
            span([p["params"][k] for p in g if p["compression"] > 1.0], spec)
            if any(p["compression"] > 1.0 for p in g)
            else "—"
            for k, spec in (("ab.sigma_cutoff", ".2f"), ("optim.lr", ".2g"))
        ]
        + [
            span([p["params"][k] for p in g if p["compression"] <= 1.0], spec)
            if any(p["compression"] <= 1.0 for p in g)
            else "—"
            for k, spec in (("ab.sigma_cutoff", ".2f"), ("optim.lr", ".2g"))
        ]
        for (m, init), g in groups.items()
    ]
    said = (
        f"{len(cut)} of the {len(ab)} AB and AB + PowerSGD points compress (above 1:1: the "
        "ranks they keep hold fewer parameters than the full layers)"
        + (
            f", keeping {span([p['kept_rank'] for p in cut], '.0%')} of the rank at "
            f"{span([p['compression'] for p in cut], '.2f')}:1"
            if cut
            else ""
        )
        + (
            ". Decay alone cuts none of them"
            if min(p["decay"] for p in ab) > max(p["params"]["ab.sigma_cutoff"] for p in ab)
            else ". Decay alone could cut some"
        )
        + ": under AdamW's decoupled decay a direction no "
        f"gradient supports keeps exp(−wd·Σlr) of its singular value, "
        f"{span([p['decay'] for p in ab], '.3f')} over these {steps} steps at the points' "
        "weight decays and schedules, against cutoffs of "
        f"{span([p['params']['ab.sigma_cutoff'] for p in ab], '.2f')} of σ_max. Where ranks "
        "fall, training spread the singular values past the cutoff; the table sets the "
        "points that cut ranks beside those that keep them."
    )
    if cut and kept:
        said += (
            f" Their best top-1: {span([p['best_top1'] for p in cut], '.1f')}% where ranks "
            f"fall, {span([p['best_top1'] for p in kept], '.1f')}% where every rank is kept."
        )
    header = ["method", "init", "compress", "cutoff (cut)", "lr (cut)", "cutoff (kept)"]
    return [said, "", *table([*header, "lr (kept)"], rows)]


def budget_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """At each budget (and at DDP's own bytes), each method's point: the one its search
    found best within the budget and that was rerun at more seeds (chosen on its first
    seed, reported as the mean over all), else its best within it."""
    pts = data["points"]
    methods = list(dict.fromkeys(p["method"] for p in pts))
    out = []
    for b in [*data["budgets"], 1.0]:
        for m in methods:
            chosen = [p for p in pts if p["method"] == m and b in p.get("chosen_at", [])]
            best = chosen[0] if chosen else best_within(pts, m, b)
            if best is not None:
                out.append(dict(budget=b, method=m, point=best))
    return out


def found_by(point: dict[str, Any]) -> str:
    """`optuna t3`, `propulate (≤ 40%) i0-w1-g0`: the search and its evaluation."""
    within = f" (≤ {point['budget']:.0%})" if point["budget"] else ""
    return f"{point['backend']}{within} {point['id']}"


KNOBS = {  # how the verdict names a point's values, shortest first
    "ab.sigma_cutoff": ("cutoff", ".2f"),
    "optim.weight_decay": ("wd", ".3g"),
    "powersgd.rank": ("rank", "d"),
    "optim.lr": ("lr", ".2g"),
}


def settings_of(point: dict[str, Any]) -> str:
    said = []
    for key, (name, spec) in KNOBS.items():
        if key in point["params"]:
            said.append(f"{name} {format(point['params'][key], spec)}")
    return ", ".join(said)


def top1_of(point: dict[str, Any]) -> str:
    sd = point["best_top1_sd"]
    n = len(point["top1"])
    return f"{point['best_top1']:.2f}" + (
        f" ± {sd:.2f}% ({n} seeds)" if sd is not None else "% (1 seed)"
    )


def verdict(data: dict[str, Any]) -> str:
    """`At ≤ 10% of DDP's inter-node bytes the best top-1 is M (method: settings); ...`,
    each budget's winner over every method, DDP's best at its own bytes last."""
    rows = budget_rows(data)
    said = []
    for b in data["budgets"]:
        here = [r for r in rows if r["budget"] == b]
        if not here:
            said.append(f"at ≤ {b:.0%} of DDP's inter-node bytes no point was found")
            continue
        win = max(here, key=lambda r: r["point"]["best_top1"])
        p = win["point"]
        ab = [r["point"] for r in here if r["method"] == "ab" and r["point"] is not p]
        said.append(
            f"at ≤ {b:.0%} of DDP's inter-node bytes the best top-1 is {top1_of(p)}, "
            f"{p['method']} ({settings_of(p)}; {p['bytes_vs_ddp']:.0%} of the bytes, "
            f"{p['compression']:.2f}:1)"
            + (
                f", AB's best {top1_of(ab[0])} at {ab[0]['compression']:.2f}:1"
                if ab
                else (", AB has no point within it" if p["method"] != "ab" else "")
            )
        )
    ddp = [r for r in rows if r["method"] == "ddp" and r["budget"] == 1.0]
    tail = ""
    if ddp:
        tail = f"; DDP itself reaches {top1_of(ddp[0]['point'])}"
    steps = data["points"][0]["steps"]
    first = said[0][0].upper() + said[0][1:]
    return (
        f"In {steps}-step runs: "
        + "; ".join([first[0].lower() + first[1:], *said[1:]])
        + tail
        + "."
    )


def draw(data: dict[str, Any], path: Path) -> None:
    """Top-1 against the share of DDP's bytes (log x): each method's points (circles from
    Optuna, squares from Propulate... in the method's colour), its front as a step line,
    seeds as error bars, the budgets as dashed lines."""
    from pipeline import style

    pts = data["points"]
    with style.matplotlib_defaults() as plt:
        fig, ax = plt.subplots(figsize=(8.5, 5.2))
        for m in style.ordered(p["method"] for p in pts):
            mine = [p for p in pts if p["method"] == m]
            colour = style.colour(m)
            for backend, shape in (("optuna", "o"), ("propulate", "s")):
                got = [p for p in mine if p["backend"] == backend]
                ax.scatter(
                    [p["bytes_vs_ddp"] for p in got],
                    [p["best_top1"] for p in got],
                    marker=shape, s=30, color=colour, alpha=0.6, edgecolors="none",
                )  # fmt: skip
                cut = [p for p in got if p["compression"] > 1.0]  # ringed: it compresses
                ax.scatter(
                    [p["bytes_vs_ddp"] for p in cut], [p["best_top1"] for p in cut],
                    marker=shape, s=60, facecolors="none", edgecolors="black", linewidths=0.9,
                )  # fmt: skip
            front = sorted((p for p in mine if p["front"]), key=lambda p: p["bytes_vs_ddp"])
            if front:
                ax.step(
                    [p["bytes_vs_ddp"] for p in front],
                    [p["best_top1"] for p in front],
                    where="post", color=colour, lw=1.8, label=m,
                )  # fmt: skip
            seeded = [p for p in mine if p["best_top1_sd"] is not None]
            if seeded:
                ax.errorbar(
                    [p["bytes_vs_ddp"] for p in seeded],
                    [p["best_top1"] for p in seeded],
                    yerr=[p["best_top1_sd"] for p in seeded],
                    fmt="D", ms=6, color=colour, mec="black", capsize=3, lw=1.2,
                )  # fmt: skip
        for b in data["budgets"]:
            ax.axvline(b, color="grey", ls="--", lw=0.8)
            ax.annotate(
                f"≤ {b:.0%}", (b, 1.0), xycoords=("data", "axes fraction"),
                xytext=(3, -12), textcoords="offset points", color="grey", fontsize=9,
            )  # fmt: skip
        ax.set_xscale("log")
        low = min(p["bytes_vs_ddp"] for p in pts) * 0.8
        ticks = [t for t in (0.01, 0.02, 0.05, 0.1, 0.2, 0.4, 1.0) if t >= low]
        ax.set_xticks(ticks, [f"{t:.0%}" for t in ticks])
        ax.set_xlim(low, 1.25)
        ax.set_xticks([], minor=True)
        ax.set_xlabel("inter-node bytes per rank, share of DDP's (log)")
        ax.set_ylabel("best validation top-1 (%)")
        steps = pts[0]["steps"]
        ax.set_title(
            f"Accuracy against bytes, {steps}-step runs: fronts as lines; ● Optuna, ■ "
            "Propulate;\n◆ mean ± sd over seeds; ringed in black: the point compresses (> 1:1)",
            fontsize=10,
        )
        ax.legend(loc="lower right", fontsize=9)
        style.save(fig, path, dpi=110)
        plt.close(fig)


def page(data: dict[str, Any]) -> str:
    pts = data["points"]
    s = data["settings"]
    steps = pts[0]["steps"]
    lines = [
        "# Accuracy against inter-node bytes",
        "",
        f"Made {data['made']} by `{data['command']}` ({duration(data['seconds'])} of "
        "searches and runs on this 2-core machine); every figure below from `points.json`.",
        "",
        f"**{data['verdict']}**",
        "",
        "![tradeoff](tradeoff.png)",
        "",
        f"*Best validation top-1 against inter-node bytes per rank as a share of DDP's "
        f"({data['ddp_bytes'] / 1e6:,.1f} MB per rank in {steps} steps), log x. A line is a "
        "method's front (no other of its points is as accurate for fewer bytes); diamonds "
        "with error bars are the points rerun at more seeds (mean ± sd).*",
        "",
        "## Each method's best within each budget",
        "",
    ]
    rows = []
    for r in budget_rows(data):
        p = r["point"]
        rows.append(
            [
                f"≤ {r['budget']:.0%}",
                p["method"],
                top1_of(p),
                f"{p['bytes_vs_ddp']:.1%}",
                f"{p['compression']:.2f}:1",
                f"{p['kept_rank']:.0%}",
                found_by(p),
                settings_of(p),
            ]
        )
    lines += table(
        ["budget", "method", "best top-1", "bytes vs DDP", "compression", "kept rank",
         "found by", "settings"],
        rows,
    )  # fmt: skip
    lines += ["", "## AB's low-rank regime", "", *low_rank(pts, steps), ""]
    lines += [
        "## What ran",
        "",
    ]
    searched = {}
    for p in pts:
        searched.setdefault((p["method"], p["backend"], p["budget"]), 0)
        searched[(p["method"], p["backend"], p["budget"])] += 1
    per_method = {}
    for (m, _, _), n in searched.items():
        per_method[m] = per_method.get(m, 0) + n
    lines += table(
        ["method", "backend", "searched", "finished points"],
        [
            [m, b, f"error under {budget:.0%} of DDP's bytes" if budget else "error alone", n]
            if b == "propulate"
            else [m, b, "both objectives", n]
            for (m, b, budget), n in searched.items()
        ],
    )
    lines += [
        "",
        "Points per method, both backends: "
        + ", ".join(f"{m} {n}" for m, n in per_method.items())
        + f". Seeds: at each budget each method's best point within it was trained again at "
        f"{s['seeds'] - 1} more seed(s) (`abtrain.launch`, {s['nodes']} nodes × "
        f"{data['ranks_per_node']} rank); a point found by both backends is one row. "
        "Each search's runs: `train` with " + ", ".join(f"`{x}`" for x in s["train"]) + ".",
        "",
        "## Every point",
        "",
    ]
    lines += table(
        ["method", "found by", "best top-1", "bytes vs DDP", "compression", "kept rank",
         "front", "settings"],
        [
            [p["method"], found_by(p), top1_of(p), f"{p['bytes_vs_ddp']:.1%}",
             f"{p['compression']:.2f}:1", f"{p['kept_rank']:.0%}", "yes" if p["front"] else "",
             settings_of(p)]
            for p in sorted(pts, key=lambda p: (p["method"], p["bytes_vs_ddp"]))
        ],
    )  # fmt: skip
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- MLflow
def log_to_mlflow(data: dict[str, Any], out: Path, uri: str, experiment: str) -> str:
    """The study as one parent run (the verdict, the figure, the record), each point a
    nested run with its values and figures; returns the parent's id."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    exp_id = exp.experiment_id if exp else client.create_experiment(experiment)
    parent = client.create_run(exp_id, run_name="tradeoff", tags={"abtrain.study": "tradeoff"})
    pid = parent.info.run_id
    client.log_param(pid, "budgets", json.dumps(data["budgets"]))
    client.set_tag(pid, "verdict", data["verdict"][:5000])
    for name in ("points.json", "tradeoff.png", "README.md"):
        client.log_artifact(pid, str(out / name))
    for p in data["points"]:
        child = client.create_run(
            exp_id,
            run_name=f"{p['method']}-{p['backend']}-{p['id']}",
            tags={"mlflow.parentRunId": pid, "method": p["method"], "backend": p["backend"]},
        )
        cid = child.info.run_id
        for k, v in p["params"].items():
            client.log_param(cid, k, v)
        for k in ("best_top1", "bytes_vs_ddp", "compression", "kept_rank"):
            client.log_metric(cid, k, float(p[k]))
        client.log_metric(cid, "inter_node_mb_per_rank", p["inter_node_bytes_per_rank"] / 1e6)
        client.log_metric(cid, "front", float(p["front"]))
        client.set_terminated(cid)
    client.set_terminated(pid)
    return pid


# ---------------------------------------------------------------- python -m bench.tradeoff
def main(argv: list[str] | None = None) -> int:
    ap = parser("bench.tradeoff", __doc__)
    study.options(ap, RUNS_DIR, OUT)
    ap.add_argument("--config", default="params.yaml", help="sections train, search, tradeoff")
    ap.add_argument("--no-mlflow", action="store_true", help="log nothing to MLflow")
    a = ap.parse_args(argv)
    p = abconfig.read_yaml(Path(a.config))
    settings(p)  # refused before anything runs
    the = Tradeoff(out=a.out, command=study.shown("bench.tradeoff", argv), p=p, runs_dir=a.runs_dir)
    code = study.conduct(the, a)
    tracking = p["train"]["tracking"]
    if code or a.dry_run or a.render or a.no_mlflow or not tracking["enabled"]:
        return code
    from abtrain.tracking import default_uri

    data = read_record(a.out / the.record, the.keys)
    pid = log_to_mlflow(data, a.out, tracking["uri"] or default_uri(), "tradeoff")
    print(f"[bench.tradeoff] MLflow: parent run {pid} in experiment 'tradeoff'", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(stage(main, who="bench.tradeoff"))
