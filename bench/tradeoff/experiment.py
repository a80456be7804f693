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
from abtrain.files import atomic_write_text, read_record, read_record_rows, write_record
from bench import study
from bench import tradeoff as package
from bench.study import Run
from bench.tradeoff import state
from bench.tradeoff.fronts import candidates, finish, key_of, points_of, search_progress
from bench.tradeoff.page import PROGRESS_FIGURE, draw, draw_progress, page, verdict
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
                        info=dict(kind="search", evaluations=n),
                    )
                )
        # at each budget (DDP: its own bytes), each method's front points again at other
        # seeds, then the point the verdict names at `long_steps`
        for m in t.methods:
            for b in [1.0] if m == "ddp" else list(t.budgets):
                for k in range(t.front_points):
                    for seed in range(1, t.seeds + 1):  # seeds other than the search's own
                        out.append(
                            self._point_run(
                                f"{m}'s front point {k + 1} within {b:g} of DDP's bytes, "
                                f"seed +{seed}",
                                self.runs_dir / "seeds" / f"{m}-b{b:g}-p{k}-s{seed}",
                                unit / 2,
                                self._seed(m, b, k, seed),
                                dict(kind="seed", method=m, budget=b, seed=seed),
                            )
                        )
                for seed in range(1, t.seeds + 1) if t.long_steps else ():
                    out.append(
                        self._point_run(
                            f"{m}'s chosen point within {b:g} of DDP's bytes at "
                            f"{t.long_steps} steps, seed +{seed}",
                            self.runs_dir / "long" / f"{m}-b{b:g}-s{seed}",
                            t.long_steps / self._steps() * unit / 2,
                            self._long(m, b, seed),
                            dict(kind="long", method=m, budget=b, seed=seed),
                        )
                    )
        return out

    def _point_run(
        self, name: str, folder: Path, seconds: float, launch: Any, info: dict[str, Any]
    ) -> Run:
        """A run of one found point, in the searches' shape (a worker's nodes and ranks)."""
        return Run(
            name=name,
            folder=folder,
            nodes=self.t.nodes,
            ranks_per_node=self.p["search"]["ranks_per_worker"] // self.t.nodes,
            seconds=study.LAUNCH_SECONDS + seconds,
            launch=launch,
            info=info,
        )

    def _search(self, method: str, backend: str, budget: float | None):
        def launch(run: Run) -> None:
            from search.launch import run_mpirun

            ddp = ddp_bytes(self.runs_dir) if budget else None
            q = search_params(self.p, self.t, method, backend, budget, ddp)
            run.folder.mkdir(parents=True, exist_ok=True)
            config = run.folder.parent / f"{run.folder.name}.params.yaml"
            atomic_write_text(config, yaml.safe_dump(q, sort_keys=False))
            args = ["--config", str(config), "--out", str(run.folder)]
            if (run.folder / "search.json").exists():
                args.append("--resume")
            try:
                failed = run_mpirun(self.t.ranks, args)
            finally:  # what it evaluated is kept, a killed search's too
                state.save(self.runs_dir, self.out / "state")
            if failed:
                raise SystemExit(f"[bench.tradeoff] error: the search in {run.folder} failed")

        return launch

    def _seed(self, method: str, budget: float, k: int, seed: int):
        def launch(run: Run) -> None:
            chosen = candidates(self._points(), method, budget, self.t.front_points)
            point = chosen[k] if k < len(chosen) else None
            self._train_point(run, "seeds", point, seed, [])

        return launch

    def _long(self, method: str, budget: float, seed: int):
        def launch(run: Run) -> None:
            point = self._chosen(method, budget)
            self._train_point(run, "long", point, seed, [f"steps={self.t.long_steps}"])

        return launch

    def _train_point(
        self, run: Run, kind: str, point: dict[str, Any] | None, seed: int, more: list[str]
    ) -> None:
        """Train `point` at the seed `seed` after the search's (its `more` overrides last);
        none to train (a method without a point there) is recorded as such, and a point
        already trained at this seed for another budget is copied, not trained again."""
        if point is None:
            run.folder.mkdir(parents=True, exist_ok=True)
            write_record(run.folder / "point.json", dict(point=None), indent=None)
            atomic_write_text(run.folder / run.done, "{}\n")
            return
        said = dict(point=key_of(point), search=point["search"], id=point["id"])
        same = [
            f
            for f in (self.runs_dir / kind).glob(f"{point['method']}-b*-s{seed}")
            if (f / run.done).exists()
            and f != run.folder
            and json.loads((f / "point.json").read_text()).get("point") == said["point"]
        ]
        if same:
            shutil.rmtree(run.folder, ignore_errors=True)
            shutil.copytree(same[0], run.folder)
            return
        base = self.p["train"]["seed"]
        run.sets = [
            *self.t.train,
            f"method={point['method']}",
            *point["overrides"],
            f"seed={base + seed}",
            "tracking.enabled=false",
            *more,
        ]
        run.folder.mkdir(parents=True, exist_ok=True)
        write_record(run.folder / "point.json", said, indent=None)
        study.start(run)
        state.save(self.runs_dir, self.out / "state")

    def _chosen(self, method: str, budget: float) -> dict[str, Any] | None:
        """The method's point within the budget that the verdict names: of its front points
        trained again, the best by those seeds' mean."""
        points = self._scored(self.runs())
        mine = [p for p in points if p["method"] == method and budget in p.get("chosen_at", [])]
        return max(mine, key=lambda p: p["best_top1"], default=None)

    def found(self, run: Run) -> str | None:
        """A search is finished when it has its best and as many rows as its budget now
        asks: one given more evaluations goes on from its state, training only those."""
        if run["kind"] != "search" or not run.finished:
            return super().found(run)
        rows = read_record_rows(run.folder / "evaluations.jsonl")
        return str(run.folder) if len(rows) >= run["evaluations"] else None

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
    def _scored(self, runs: list[Run]) -> list[dict[str, Any]]:
        """Every configuration the searches found (one row for a point two searches both
        found), with the top-1 of its runs at other seeds (`top1` after the search's own,
        `chosen_at`: the budgets it was a candidate at) and at `long_steps` (`long_top1`)."""
        by_key = {}
        for p in points_of(self.runs_dir, self.t):
            by_key.setdefault(key_of(p), p)
        for r in runs:
            if r["kind"] not in ("seed", "long") or not (r.folder / r.done).exists():
                continue
            chosen = json.loads((r.folder / "point.json").read_text()).get("point")
            if chosen is None or chosen not in by_key:
                continue
            top1 = read_record(r.folder / "summary.json", ("val_top1",))["val_top1"]["best"]
            p = by_key[chosen]
            at, offsets, values = (
                ("chosen_at", "seed_offsets", "top1")
                if r["kind"] == "seed"
                else ("long_at", "long_offsets", "long_top1")
            )
            if r["budget"] not in p.setdefault(at, []):
                p[at].append(r["budget"])
            seen = p.setdefault(offsets, [0] if r["kind"] == "seed" else [])
            if r["seed"] not in seen:
                seen.append(r["seed"])
                p.setdefault(values, []).append(top1)
        base = self.p["train"]["seed"]
        points = list(by_key.values())
        for p in points:
            p["seeds"] = [base + s for s in p.pop("seed_offsets", [0])]
            if "long_offsets" in p:
                p["long_seeds"] = [base + s for s in p.pop("long_offsets")]
                p["long_steps"] = self.t.long_steps
        return finish(points, ddp_bytes(self.runs_dir), self._steps())

    def aggregate(self, runs: list[Run]) -> dict[str, Any]:
        t = self.t
        points = self._scored(runs)
        for p in points:
            p["decay"] = self._decay(p)
        ddp = ddp_bytes(self.runs_dir)
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
            searches=search_progress(self.runs_dir, t, ddp, self.p["search"]["ranks_per_worker"]),
        )

    def refresh(self, data: dict[str, Any]) -> dict[str, Any]:
        data["points"] = finish(data["points"], data["ddp_bytes"], data["points"][0]["steps"])
        return data

    # ------------------------------------------------------------ what it says
    def sentence(self, data: dict[str, Any]) -> str:
        return verdict(data)

    def figure(self, data: dict[str, Any], path: Path) -> None:
        draw(data, path)
        if data.get("searches"):  # a record made before the searches' progress was kept
            draw_progress(data, path.with_name(PROGRESS_FIGURE))

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
    if not a.render and (restored := state.restore(a.runs_dir, a.out / "state")):
        print(
            f"[bench.tradeoff] {restored} files of the committed state restored into "
            f"{a.runs_dir}: finished searches and runs are read back, not trained",
            flush=True,
        )
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
