"""What a rerun of the search moves: the Propulate search rerun as the pipeline runs it, and
the ddp/ab pair of the matrix trained from each rerun's best.

    python -m bench.search_reruns --dry-run        # the searches and runs, their time
    python -m bench.search_reruns                  # 3 reruns, ddp-2x2 and ab-2x2 from each
    python -m bench.search_reruns --report-only    # rebuild reports/search-reruns
    python -m bench.search_reruns --render         # the README again from reruns.json

Propulate's individuals arrive asynchronously and its median pruning sees whatever has
finished, so two searches with the same settings and seed can pick different
configurations. The pipeline therefore trains from a committed record of one search
(results/search/BACKEND); this study measures what another search would have given. A
study on bench.study's skeleton: each rerun is `search.backend`'s search with params.yaml's
settings on `search.ranks` MPI ranks (`search.launch.run_mpirun`), in
runs/search-reruns/rN/search, then each run of `--runs` with that best, as `dvc repro`
trains it (`pipeline.matrix.run_overrides`) plus `tracking.enabled=false`, in
runs/search-reruns/rN/NAME. The pipeline's own search and its runs (results/) are the first
row. A search or run that finished is read, not rerun. Writes
reports/search-reruns/reruns.json and README.md, every figure of the README from the JSON.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from abtrain.files import read_record, read_record_rows
from bench import study
from bench.seeds import spread  # n, mean, min, max, range, std (n − 1)
from bench.study import Run
from pipeline.report.markdown import fmt, table
from pipeline.stage import parser, stage

RUNS = ("ddp-2x2", "ab-2x2")  # the baseline first
RUNS_DIR = Path("runs/search-reruns")
OUT = Path("reports/search-reruns")
SEEDS = Path("reports/seeds-best-ab/seeds.json")  # the same pair over seeds, for scale


# ---------------------------------------------------------------- the plan
def list_runs(p: dict[str, Any], names: tuple[str, ...], reruns: int, runs_dir: Path) -> list[Run]:
    """Search by search, each followed by the runs trained from its best: a study cut
    short keeps whole rows. Estimates: the committed search's and runs' own times."""
    from pipeline.matrix import run_overrides, runs
    from pipeline.stage import SEARCHES

    matrix, backend = runs(p), p["search"]["backend"]
    evaluations = SEARCHES / backend / "evaluations.jsonl"
    searched = (
        study.LAUNCH_SECONDS + max(r.get("t_end", 0.0) for r in read_record_rows(evaluations))
        if evaluations.exists()
        else None
    )

    def search(run: Run) -> None:
        from search.launch import run_mpirun

        args = ["--backend", backend, "--out", str(run.folder.resolve())]
        if run_mpirun(int(p["search"]["ranks"]), args):
            raise SystemExit(f"the search in {run.folder} failed (its output is above)")

    def from_best(name: str, found: Path) -> Callable[[Run], None]:
        def launch(run: Run) -> None:  # its overrides are known once the search has run
            best = read_record(found / "best.json", ("params",))
            run.sets = run_overrides(p, matrix[name], best) + ["tracking.enabled=false"]
            study.start(run)

        return launch

    out = []
    for i in range(1, reruns + 1):
        folder = runs_dir / f"r{i}"
        out.append(
            Run(
                name=f"r{i}'s {backend} search",
                folder=folder / "search",
                seconds=searched,
                done="best.json",  # what a search leaves when it has finished
                launch=search,
            )
        )
        for name in names:
            out.append(
                Run(
                    name=f"{name} from r{i}'s best",
                    folder=folder / name,
                    nodes=matrix[name].nodes,
                    ranks_per_node=matrix[name].ranks_per_node,
                    seconds=study.matrix_seconds(name),
                    launch=from_best(name, folder / "search"),
                )
            )
    return out


# ---------------------------------------------------------------- what the runs give
def row(label: str, best: dict[str, Any], summaries: dict[str, dict[str, Any]]) -> dict:
    base, other = (summaries[n] for n in summaries)
    top1 = {n: s["val_top1"]["best"] for n, s in summaries.items()}
    return dict(
        search=label,
        best_error=best["error"],
        params=best["params"],
        top1_best=top1,
        top1_gap=top1[other["run"]] - top1[base["run"]],
        bytes_ratio=other["traffic"]["inter_node_bytes"] / base["traffic"]["inter_node_bytes"],
    )


def summary_of(path: Path, name: str) -> dict[str, Any]:
    s = read_record(path)
    return {**s, "run": name}


def collect(names: tuple[str, ...], reruns: int, runs_dir: Path) -> list[dict[str, Any]]:
    from pipeline.stage import SEARCHES, params

    backend = params()["search"]["backend"]
    rows = []
    committed = SEARCHES / backend / "best.json"
    results = {n: Path("results") / f"{n}.json" for n in names}
    if committed.exists() and all(r.exists() for r in results.values()):
        summaries = {n: summary_of(results[n], n) for n in names}
        rows.append(row("pipeline", read_record(committed), summaries))
    for i in range(1, reruns + 1):
        folder = runs_dir / f"r{i}"
        done = [folder / n / "summary.json" for n in names]
        if not (folder / "search" / "best.json").exists() or not all(d.exists() for d in done):
            continue
        summaries = {n: summary_of(folder / n / "summary.json", n) for n in names}
        best = json.loads((folder / "search" / "best.json").read_text())
        rows.append(row(f"r{i}", best, summaries))
    return rows


def spreads(rows: list[dict[str, Any]], names: list[str]) -> dict[str, dict[str, Any]]:
    """Each figure's spread over the searches."""
    return {
        "best error (%)": spread([r["best_error"] for r in rows]),
        "top1 gap (points)": spread([r["top1_gap"] for r in rows]),
        "bytes ratio": spread([r["bytes_ratio"] for r in rows]),
        **{f"{n} top-1 (%)": spread([r["top1_best"][n] for r in rows]) for n in names},
    }


def seed_spread(path: Path) -> dict[str, Any] | None:
    """The matching seed study's spread of the same gap (same pair, the pipeline's best)."""
    if not path.exists():
        return None
    d = read_record(path, ("summary",))["summary"]["difference"]
    gaps = list(d["per_seed"].values())
    return dict(study=str(path.parent), of=d["of"], **spread(gaps)) if len(gaps) > 1 else None


# ---------------------------------------------------------------- the sentence and the page
def markdown(data: dict[str, Any]) -> str:
    rows, names = data["rows"], data["runs"]
    keys = sorted({k for r in rows for k in r["params"]})

    def value(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    lines = [
        f"# What a rerun of the search moves: {data['backend']}, {len(rows)} searches",
        "",
        f"Generated by `{data['command']}` on {data['generated']}. Each search has the "
        "settings of params.yaml (`search`), as `dvc repro` runs it; `pipeline` is the search "
        "whose record the committed runs train from (results/search), r1... are reruns. "
        f"From each best, {' and '.join(f'`{n}`' for n in names)} trained as the pipeline "
        "trains them. Figures: `reruns.json`.",
        "",
        *table(
            ["search", "best error (%)", *(f"`{k}`" for k in keys)]
            + [*(f"{n} top-1" for n in names), "top-1 gap", "bytes ratio"],
            (
                [r["search"], f"{r['best_error']:.2f}", *(value(r["params"].get(k)) for k in keys)]
                + [f"{r['top1_best'][n]:.2f}" for n in names]
                + [f"{r['top1_gap']:+.2f}", f"{r['bytes_ratio']:.3f}"]
                for r in rows
            ),
        ),
        "",
        "Spread over the searches (sd: sample standard deviation):",
        "",
        *table(
            ["figure", "n", "mean", "sd", "min", "max"],
            (
                [label, sp["n"], f"{sp['mean']:.3f}", fmt(sp["std"], ".3f")]
                + [f"{sp['min']:.3f}", f"{sp['max']:.3f}"]
                for label, sp in data["spread"].items()
            ),
        ),
    ]
    seeds = data["seed_spread"]
    if seeds:
        lines += [
            "",
            f"For scale, the same gap ({seeds['of']}) over seeds with the pipeline's best "
            f"([`{Path(seeds['study']).name}/`](../{Path(seeds['study']).name}/README.md)): "
            f"mean {seeds['mean']:+.2f}, sd {seeds['std']:.2f}, {seeds['min']:+.2f} to "
            f"{seeds['max']:+.2f} (n = {seeds['n']}).",
        ]
    lines += ["", data["verdict"], ""]
    return "\n".join(lines)


def verdict(data: dict[str, Any]) -> str:
    s, seeds = data["spread"], data["seed_spread"]
    gap, ratio = s["top1 gap (points)"], s["bytes ratio"]
    if gap["n"] < 2:
        return "Too few searches for a spread."
    text = (
        f"Across {gap['n']} searches the chosen configuration moves, and with it the top-1 "
        f"gap ({gap['min']:+.2f} to {gap['max']:+.2f} points, sd {gap['std']:.2f}) and the "
        f"bytes ratio ({ratio['min']:.3f} to {ratio['max']:.3f}, sd {ratio['std']:.3f}): the "
        "bytes ratio depends on the search through the σ cutoff and the sync mode it picks "
        "(what AB sends at a sync), the gap through every value it picks."
    )
    if seeds:
        text += (
            f" Against the seed spread of the same gap (sd {seeds['std']:.2f}), a rerun of "
            "the search moves it "
            + ("more" if gap["std"] > seeds["std"] else "no more")
            + " than a change of seed does."
        )
    return text


# ---------------------------------------------------------------- the study
@dataclass
class Reruns(study.Study):
    """The study on the skeleton: searches and the runs from their bests, a record and a
    page (no figure: the tables are the study)."""

    name, record, keys = "search_reruns", "reruns.json", ("rows", "runs", "seed_spread")
    basis = "the committed search's and runs' times"

    names: tuple[str, ...] = RUNS
    reruns: int = 3
    runs_dir: Path = RUNS_DIR

    def runs(self) -> list[Run]:
        from pipeline.stage import params

        return list_runs(params(), self.names, self.reruns, self.runs_dir)

    def aggregate(self, runs: list[Run]) -> dict[str, Any]:
        """From the plan's folders and the pipeline's own record (`collect` finds them)."""
        from pipeline.stage import params

        rows = collect(self.names, self.reruns, self.runs_dir)
        if not rows:
            raise SystemExit("no finished search with its runs: nothing to report")
        return dict(
            generated=study.stamp(),
            command=self.command,
            backend=params()["search"]["backend"],
            model=params()["train"]["model"],  # the report names reruns of another model apart
            runs=list(self.names),
            runs_dir=str(self.runs_dir),
            rows=rows,
            spread=spreads(rows, list(self.names)),
            seed_spread=seed_spread(SEEDS),
        )

    def refresh(self, data: dict[str, Any]) -> dict[str, Any]:
        # the seed study's spread stays as it was when the record was made
        data["spread"] = spreads(data["rows"], data["runs"])
        return data

    def sentence(self, data: dict[str, Any]) -> str:
        return verdict(data)

    def page(self, data: dict[str, Any]) -> str:
        return markdown(data)


def main(argv: list[str] | None = None) -> int:
    ap = parser("bench.search_reruns", __doc__)
    ap.add_argument("--reruns", type=int, default=3, help="searches besides the pipeline's")
    ap.add_argument("--runs", nargs=2, default=list(RUNS), metavar=("BASELINE", "OTHER"))
    study.options(ap, RUNS_DIR, OUT)
    a = ap.parse_args(argv)
    reruns = Reruns(
        a.out, study.shown("bench.search_reruns", argv), tuple(a.runs), a.reruns, a.runs_dir
    )
    return study.conduct(reruns, a)


if __name__ == "__main__":
    raise SystemExit(stage(main, who="bench"))
