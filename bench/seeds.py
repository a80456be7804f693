"""Seed spread: the default profile's ddp and ab runs at several seeds, so a reader can tell
which top-1 differences of the report are noise.

    python -m bench.seeds                       # seeds 0 1 2, ddp-2x2 and ab-2x2
    python -m bench.seeds --report-only         # rebuild reports/seeds from runs/seeds
    python -m bench.seeds --search-best --runs ddp-2x2 abps-2x2 \
        --runs-dir runs/seeds-best --out reports/seeds-best-abps   # as the pipeline trains

Each run is `experiments.runs.NAME` of params.yaml made into overrides by
`pipeline.common.run_overrides(p, run, best)`: by default *without* the hyperparameter
search's best values (best=None); with `--search-best`, with them, as the committed
report's runs are trained. Plus `seed=S`, `tracking.enabled=false` and any `--set`,
launched as `python -m abtrain.launch --nnodes N --nproc-per-node R train --config
params.yaml --set ... --out runs/seeds/NAME-sS`. A run
folder that already holds a summary.json is read, not rerun. Writes
`reports/seeds/seeds.json` and `reports/seeds/README.md` (atomically), every figure of the
README from the JSON.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from abtrain.files import atomic_write_text
from pipeline.common import stage

RUNS = ("ddp-2x2", "ab-2x2")  # the baseline first
SEEDS = (0, 1, 2)
RUNS_DIR = Path("runs/seeds")
OUT = Path("reports/seeds")
HEADLINE = Path("reports/table2_compression.csv")  # the committed report's Δ top-1 vs ddp


def command(run: Any, sets: list[str], out: Path) -> list[str]:
    args = [sys.executable, "-m", "abtrain.launch", "--nnodes", str(run.nodes)]
    args += ["--nproc-per-node", str(run.ranks_per_node), "train", "--config", "params.yaml"]
    for s in sets:
        args += ["--set", s]
    return [*args, "--out", str(out)]


def train(
    names: tuple[str, ...],
    seeds: tuple[int, ...],
    runs_dir: Path,
    extra: list[str],
    search_best: bool = False,
) -> None:
    from pipeline.common import best_config, params, run_overrides, runs

    p = params()
    matrix = runs(p)
    best = best_config(p) if search_best else None
    for seed in seeds:  # seed by seed: a cut-short session still has whole pairs
        for name in names:
            out = runs_dir / f"{name}-s{seed}"
            if (out / "summary.json").exists():
                print(f"{out}: done, reading it", flush=True)
                continue
            run = matrix[name]
            sets = run_overrides(p, run, best) + [f"seed={seed}", "tracking.enabled=false"]
            sets += extra
            args = command(run, sets, out)
            print(" ".join(args), flush=True)
            t0 = time.monotonic()
            subprocess.run(args, check=True)
            (out / "launch_seconds.txt").write_text(f"{time.monotonic() - t0:.3f}\n")


def collect(names: tuple[str, ...], seeds: tuple[int, ...], runs_dir: Path) -> dict[str, Any]:
    """{name: {seed: row}} from the run folders that finished."""
    found: dict[str, Any] = {}
    for name in names:
        for seed in seeds:
            out = runs_dir / f"{name}-s{seed}"
            path = out / "summary.json"
            if not path.exists():
                continue
            s = json.loads(path.read_text())
            launch = out / "launch_seconds.txt"
            found.setdefault(name, {})[str(seed)] = dict(
                method=s["method"],
                steps=s["steps"],
                world_size=s["world_size"],
                nodes=s["nodes"],
                best_top1=s["val_top1"]["best"],
                final_top1=s["val_top1"]["final"],
                inter_node_bytes_per_rank=s["traffic"]["inter_node_bytes"],
                wall_seconds=s["wall_seconds"],
                launch_seconds=float(launch.read_text()) if launch.exists() else None,
            )
    return found


def spread(values: list[float]) -> dict[str, Any]:
    """n, mean, min, max, range and sample standard deviation (n − 1; None below 2)."""
    return dict(
        n=len(values),
        mean=statistics.fmean(values),
        min=min(values),
        max=max(values),
        range=max(values) - min(values),
        std=statistics.stdev(values) if len(values) > 1 else None,
    )


def summarize(found: dict[str, Any], baseline: str, other: str) -> dict[str, Any]:
    """Per method the spread of best top-1; the other−baseline difference per seed."""
    methods = {
        name: dict(
            method=next(iter(rows.values()))["method"],
            seeds=sorted(int(k) for k in rows),
            best_top1=spread([r["best_top1"] for r in rows.values()]),
            final_top1=spread([r["final_top1"] for r in rows.values()]),
        )
        for name, rows in found.items()
    }
    both = sorted(set(found.get(baseline, {})) & set(found.get(other, {})), key=int)
    diff = {k: found[other][k]["best_top1"] - found[baseline][k]["best_top1"] for k in both}
    return dict(
        methods=methods,
        difference=dict(
            of=f"{other} - {baseline}",
            metric="best val top-1 (%)",
            per_seed=diff,
            spread=spread(list(diff.values())) if diff else None,
        ),
    )


def headline(path: Path, name: str) -> float | None:
    if not path.exists():
        return None
    for row in csv.DictReader(path.open()):
        if row["run"] == name:
            return float(row["diff_top1"])
    return None


def markdown(data: dict[str, Any]) -> str:
    runs, s = data["runs"], data["summary"]
    base, other = data["baseline"], data["compared"]
    d = s["difference"]
    lines = [
        f"# Seed spread: {base} and {other} of the default profile",
        "",
        f"Generated by `{data['command']}` on {data['generated']}. Each run is the default "
        "profile's run of `experiments.runs` "
        + (
            "(`pipeline.common.run_overrides(p, run, best)`: **with** the hyperparameter "
            "search's best values, as the committed report's runs are trained) "
            if data["search_best_values"]
            else "(`pipeline.common.run_overrides(p, run, None)`: **without** the "
            "hyperparameter search's best values, unlike the committed report's runs) "
        )
        + "with "
        + ", ".join(f"`{x}`" for x in data["overrides_extra"])
        + "; "
        f"{data['steps'][base]} steps, 4 ranks as 2 nodes. Run folders: `{data['runs_dir']}`; "
        "figures: `seeds.json`.",
        "",
        "| run | seed | best top-1 (%) | final top-1 (%) | inter-node MB per rank | wall (s) |",
        "|---|---|---|---|---|---|",
    ]
    for name, rows in runs.items():
        for seed, r in sorted(rows.items(), key=lambda kv: int(kv[0])):
            lines.append(
                f"| {name} | {seed} | {r['best_top1']:.2f} | {r['final_top1']:.2f} | "
                f"{r['inter_node_bytes_per_rank'] / 1e6:.1f} | {r['wall_seconds']:.0f} |"
            )
    lines += [
        "",
        "Best top-1 per run over the seeds (std: sample standard deviation, n − 1):",
        "",
        "| run | seeds | mean | min | max | range | std |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, m in s["methods"].items():
        b = m["best_top1"]
        std = f"{b['std']:.2f}" if b["std"] is not None else "—"
        lines.append(
            f"| {name} | {b['n']} | {b['mean']:.2f} | {b['min']:.2f} | {b['max']:.2f} | "
            f"{b['range']:.2f} | {std} |"
        )
    lines += ["", f"{d['of']}, best top-1 (percentage points) per seed:", ""]
    lines += ["| seed | " + " | ".join(d["per_seed"]) + " | mean | min | max | std |"]
    lines += ["|---" * (len(d["per_seed"]) + 5) + "|"]
    sp = d["spread"]
    if sp:
        std = f"{sp['std']:.2f}" if sp["std"] is not None else "—"
        lines.append(
            "| Δ | "
            + " | ".join(f"{v:+.2f}" for v in d["per_seed"].values())
            + f" | {sp['mean']:+.2f} | {sp['min']:+.2f} | {sp['max']:+.2f} | {std} |"
        )
    lines += [
        "",
        data["verdict"],
        "",
        "wall: the run's own `wall_seconds` (summary.json); `launch_seconds` in seeds.json "
        "adds process start-up. Reproduce (about 1 minute a run on 2 CPU cores):",
        "",
        "```bash",
        ".venv/bin/python -m abtrain prepare --config params.yaml",
        data["command"],
        "```",
        "",
    ]
    return "\n".join(lines)


def verdict(summary: dict[str, Any], head: float | None, base: str, other: str) -> str:
    m, d = summary["methods"], summary["difference"]
    sp = d["spread"]
    if not sp or any(v["best_top1"]["std"] is None for v in m.values()):
        return "Too few seeds for a spread."
    noise = max(v["best_top1"]["range"] for v in m.values())
    per = list(d["per_seed"].values())
    below = sum(v < 0 for v in per)
    text = (
        f"Across seeds, one method's best top-1 moves by up to {noise:.2f} points (largest "
        f"range above), and the paired {other} − {base} difference spans {sp['min']:+.2f} to "
        f"{sp['max']:+.2f} (mean {sp['mean']:+.2f}, std {sp['std']:.2f}); {other} is below "
        f"{base} at {below} of {len(per)} seeds. "
    )
    if head is not None:
        inside = sp["min"] <= head <= sp["max"]
        text += (
            f"The committed report's {other} gap of {head:+.2f} (one seed, with the "
            "search's values) lies "
            + ("inside" if inside else "outside")
            + " that span: "
            + (
                "its sign is supported by every seed here, its size is not pinned down "
                f"(from {abs(sp['max']):.2f} to {abs(sp['min']):.2f} points across seeds). "
                if inside and below == len(per)
                else "read it with that span in mind. "
            )
        )
        text += (
            f"Single-seed top-1 differences of the report smaller than about {noise:.1f} "
            "points (its Δ top-1 columns) are within noise. "
        )
    else:  # another configuration than the report's runs: its noise is its own
        text += "These runs are not the report's configuration: their spread is their own. "
    return text + "The inter-node bytes do not depend on the seed (identical at every seed above)."


def report(
    names: tuple[str, ...],
    seeds: tuple[int, ...],
    runs_dir: Path,
    out: Path,
    cmd: str,
    search_best: bool = False,
    extra: tuple[str, ...] | list[str] = (),
) -> dict[str, Any]:
    from pipeline.common import best_config, params

    found = collect(names, seeds, runs_dir)
    summary = summarize(found, names[0], names[1])
    # which search result trained them: a study of another record is another configuration
    best = best_config(params()) if search_best else None
    # the committed run is trained with the search's values and without extra overrides: a
    # study without those is another configuration, its gap not the same quantity
    head = headline(HEADLINE, names[1]) if search_best and not extra else None
    data = dict(
        generated=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        command=cmd,
        runs_dir=str(runs_dir),
        baseline=names[0],
        compared=names[1],
        seeds=list(seeds),
        search_best_values=search_best,
        search_best=best["params"] if best else None,
        overrides_extra=["seed=S", "tracking.enabled=false", *extra],
        model=params()["train"]["model"],  # the report names a study of another model apart
        steps={n: next(iter(r.values()))["steps"] for n, r in found.items()},
        headline_diff_top1=head,
        runs=found,
        summary=summary,
    )
    data["verdict"] = verdict(summary, head, names[0], names[1])
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "seeds.json", json.dumps(data, indent=2) + "\n")
    atomic_write_text(out / "README.md", markdown(data))
    return data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.seeds", description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    ap.add_argument("--runs", nargs=2, default=list(RUNS), metavar=("BASELINE", "OTHER"))
    ap.add_argument("--runs-dir", type=Path, default=RUNS_DIR)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--set", action="append", default=[], help="further train overrides")
    ap.add_argument("--report-only", action="store_true", help="read run folders, train none")
    ap.add_argument(
        "--search-best",
        action="store_true",
        help="train with the search's best values, as the pipeline does (results/search/*/best.json)",
    )
    a = ap.parse_args(argv)
    names, seeds = tuple(a.runs), tuple(a.seeds)
    # the command the README names: the one that trained (--report-only only re-reads)
    shown = [x for x in (sys.argv[1:] if argv is None else argv) if x != "--report-only"]
    cmd = " ".join([".venv/bin/python -m bench.seeds", *shown])
    if not a.report_only:
        train(names, seeds, a.runs_dir, a.set, a.search_best)
    data = report(names, seeds, a.runs_dir, a.out, cmd, a.search_best, a.set)
    print(json.dumps(data["summary"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(stage(main, who="bench"))
