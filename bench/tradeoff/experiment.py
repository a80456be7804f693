"""The trade-off study on bench.study's skeleton: its searches and seed runs, the record
they make, and `python -m bench.tradeoff`."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from abtrain import config as abconfig
from abtrain.files import atomic_write_text, read_record, write_record
from bench import study
from bench import tradeoff as package
from bench.study import Run
from bench.tradeoff.fronts import best_within, finish, key_of, points_of
from bench.tradeoff.page import draw, page, verdict
from bench.tradeoff.settings import (
    OUT,
    RUNS_DIR,
    TradeoffConfig,
    ddp_bytes,
    folder_of,
    round_seconds,
    search_params,
    searches_of,
    settings,
)
from bench.tradeoff.tracking import log_to_mlflow
from pipeline.stage import parser


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

    def runs(self) -> list[Run]:
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
                write_record(run.folder / "point.json", dict(point=None), indent=None)
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
            write_record(run.folder / "point.json", point, indent=None)
            study.start(run)

        return launch

    def _points(self) -> list[dict[str, Any]]:
        pts = points_of(self.runs_dir, self.t)
        ddp = ddp_bytes(self.runs_dir)
        return finish(pts, ddp, self._steps())

    def _decay(self, point: dict[str, Any]) -> float:
        """What decay alone leaves of a singular value over the point's run
        (abtrain.method.schedule.decay_left)."""
        from abtrain.method.schedule import decay_left

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


# ---------------------------------------------------------------- python -m bench.tradeoff
def main(argv: list[str] | None = None) -> int:
    ap = parser("bench.tradeoff", package.__doc__)
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
    from abtrain.tracking.tracker import default_uri

    data = read_record(a.out / the.record, the.keys)
    pid = log_to_mlflow(data, a.out, tracking["uri"] or default_uri(), "tradeoff")
    print(f"[bench.tradeoff] MLflow: parent run {pid} in experiment 'tradeoff'", flush=True)
    return 0
