"""What a rerun of the search moves: the Propulate search rerun as the pipeline runs it, and
the ddp/ab pair of the matrix trained from each rerun's best.

    python -m bench.search_reruns                  # 3 reruns, ddp-2x2 and ab-2x2 from each
    python -m bench.search_reruns --report-only    # rebuild reports/search-reruns

Propulate's individuals arrive asynchronously and its median pruning sees whatever has
finished, so two searches with the same settings and seed can pick different
configurations. The pipeline therefore trains from a committed record of one search
(results/search/BACKEND); this study measures what another search would have given. Each
rerun is `search.backend`'s search with params.yaml's settings on `search.ranks` MPI ranks
(`pipeline.search.run_mpirun`), in runs/search-reruns/rN/search, then each run of `--runs`
with that best, as `dvc repro` trains it (`pipeline.common.run_overrides`) plus
`tracking.enabled=false`, in runs/search-reruns/rN/NAME. The pipeline's own search and its
runs (results/) are the first row. A folder that finished is read, not rerun. Writes
reports/search-reruns/reruns.json and README.md, every figure of the README from the JSON.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from abtrain.files import atomic_write_text, read_record
from bench.seeds import spread  # n, mean, min, max, range, std (n − 1)
from pipeline.common import stage

RUNS = ("ddp-2x2", "ab-2x2")  # the baseline first
RUNS_DIR = Path("runs/search-reruns")
OUT = Path("reports/search-reruns")
SEEDS = Path("reports/seeds-best-ab/seeds.json")  # the same pair over seeds, for scale


def search(p: dict[str, Any], folder: Path) -> dict[str, Any]:
    from pipeline.search import run_mpirun

    if not (folder / "best.json").exists():
        args = ["--backend", p["search"]["backend"], "--out", str(folder.resolve())]
        print(f"search in {folder}", flush=True)
        if run_mpirun(int(p["search"]["ranks"]), args):
            raise SystemExit(f"the search in {folder} failed (its output is above)")
    return json.loads((folder / "best.json").read_text())


def train(p: dict[str, Any], names: tuple[str, ...], best: dict[str, Any], folder: Path) -> None:
    from bench.seeds import command
    from pipeline.common import run_overrides, runs

    matrix = runs(p)
    for name in names:
        out = folder / name
        if (out / "summary.json").exists():
            continue
        sets = run_overrides(p, matrix[name], best) + ["tracking.enabled=false"]
        args = command(matrix[name], sets, out)
        print(" ".join(args), flush=True)
        subprocess.run(args, check=True)


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
    from pipeline.common import SEARCHES, params

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


def seed_spread(path: Path) -> dict[str, Any] | None:
    """The matching seed study's spread of the same gap (same pair, the pipeline's best)."""
    if not path.exists():
        return None
    d = read_record(path, ("summary",))["summary"]["difference"]
    gaps = list(d["per_seed"].values())
    return dict(study=str(path.parent), of=d["of"], **spread(gaps)) if len(gaps) > 1 else None


def markdown(data: dict[str, Any]) -> str:
    rows, names = data["rows"], data["runs"]
    keys = sorted({k for r in rows for k in r["params"]})
    lines = [
        f"# What a rerun of the search moves: {data['backend']}, {len(rows)} searches",
        "",
        f"Generated by `{data['command']}` on {data['generated']}. Each search has the "
        "settings of params.yaml (`search`), as `dvc repro` runs it; `pipeline` is the search "
        "whose record the committed runs train from (results/search), r1... are reruns. "
        f"From each best, {' and '.join(f'`{n}`' for n in names)} trained as the pipeline "
        "trains them. Figures: `reruns.json`.",
        "",
        "| search | best error (%) | "
        + " | ".join(f"`{k}`" for k in keys)
        + " | "
        + " | ".join(f"{n} top-1" for n in names)
        + " | top-1 gap | bytes ratio |",
        "|---" * (len(keys) + len(names) + 4) + "|",
    ]
    for r in rows:
        vals = [r["params"].get(k) for k in keys]
        cells = [f"{v:.4g}" if isinstance(v, float) else str(v) for v in vals]
        lines.append(
            f"| {r['search']} | {r['best_error']:.2f} | "
            + " | ".join(cells)
            + " | "
            + " | ".join(f"{r['top1_best'][n]:.2f}" for n in names)
            + f" | {r['top1_gap']:+.2f} | {r['bytes_ratio']:.3f} |"
        )
    s = data["spread"]
    lines += [
        "",
        "Spread over the searches (sd: sample standard deviation):",
        "",
        "| figure | n | mean | sd | min | max |",
        "|---|---|---|---|---|---|",
    ]
    for label, sp in s.items():
        sd = f"{sp['std']:.3f}" if sp["std"] is not None else "—"
        lines.append(
            f"| {label} | {sp['n']} | {sp['mean']:.3f} | {sd} | {sp['min']:.3f} | {sp['max']:.3f} |"
        )
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


def report(names: tuple[str, ...], reruns: int, runs_dir: Path, out: Path, cmd: str) -> dict:
    from pipeline.common import params

    rows = collect(names, reruns, runs_dir)
    if not rows:
        raise SystemExit("no finished search with its runs: nothing to report")
    data: dict[str, Any] = dict(
        generated=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        command=cmd,
        backend=params()["search"]["backend"],
        model=params()["train"]["model"],  # the report names reruns of another model apart
        runs=list(names),
        runs_dir=str(runs_dir),
        rows=rows,
        spread={
            "best error (%)": spread([r["best_error"] for r in rows]),
            "top1 gap (points)": spread([r["top1_gap"] for r in rows]),
            "bytes ratio": spread([r["bytes_ratio"] for r in rows]),
            **{f"{n} top-1 (%)": spread([r["top1_best"][n] for r in rows]) for n in names},
        },
        seed_spread=seed_spread(SEEDS),
    )
    data["verdict"] = verdict(data)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "reruns.json", json.dumps(data, indent=2) + "\n")
    atomic_write_text(out / "README.md", markdown(data))
    return data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.search_reruns", description=__doc__)
    ap.add_argument("--reruns", type=int, default=3, help="searches besides the pipeline's")
    ap.add_argument("--runs", nargs=2, default=list(RUNS), metavar=("BASELINE", "OTHER"))
    ap.add_argument("--runs-dir", type=Path, default=RUNS_DIR)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--report-only", action="store_true", help="read folders, run nothing")
    a = ap.parse_args(argv)
    from pipeline.common import params

    names = tuple(a.runs)
    shown = [x for x in (sys.argv[1:] if argv is None else argv) if x != "--report-only"]
    cmd = " ".join([".venv/bin/python -m bench.search_reruns", *shown])
    if not a.report_only:
        p = params()
        for i in range(1, a.reruns + 1):  # search by search: a cut-short study keeps whole rows
            folder = a.runs_dir / f"r{i}"
            train(p, names, search(p, folder / "search"), folder)
    data = report(names, a.reruns, a.runs_dir, a.out, cmd)
    print(json.dumps(data["spread"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(stage(main, who="bench"))
