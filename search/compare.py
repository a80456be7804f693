"""Propulate against Optuna on the same budget: best error so far against the number of
evaluations and against wall time. `python -m search.compare OUT... --out DIR`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from abtrain.files import write_record
from search.record import SearchError, evaluations


def curves(out: Path) -> dict[str, Any]:
    """Best-so-far error by evaluation (in order of completion) and by wall time."""
    rows = sorted(evaluations(out), key=lambda r: r["t_end"])
    best, by_eval = float("inf"), []
    for i, r in enumerate(rows):
        if r["status"] == "ok":
            best = min(best, r["error"])
        by_eval.append(dict(evaluation=i + 1, seconds=r["t_end"], best_error=best))
    backend = rows[0]["backend"] if rows else "?"
    return dict(
        backend=backend,
        folder=str(out),
        evaluations=len(rows),
        curve=by_eval,
        best_error=best if rows else None,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m search.compare")
    p.add_argument("searches", nargs="+", type=Path)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    results = []
    for folder in args.searches:
        if not (folder / "evaluations.jsonl").exists():
            print(f"error: {folder} holds no evaluations.jsonl", file=sys.stderr)
            return 2
        try:
            results.append(curves(folder))
        except SearchError as err:  # a damaged file: name it rather than a traceback
            print(f"error: {err}", file=sys.stderr)
            return 2
    args.out.mkdir(parents=True, exist_ok=True)
    write_record(args.out / "search_comparison.json", results)
    plot(results, args.out / "search_comparison.png")
    for r in results:
        print(f"{r['backend']:<10} {r['evaluations']:>4} evaluations, best error {r['best_error']}")
    return 0


# neither a method's colour in the report's figures (pipeline.style) nor like one
BACKEND_STYLE = {
    "propulate": dict(color="#222222", ls="-"),
    "optuna": dict(color="#8c6d31", ls="--"),
}


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for r in results:
        xs = [c["evaluation"] for c in r["curve"]]
        ts = [c["seconds"] for c in r["curve"]]
        ys = [c["best_error"] for c in r["curve"]]
        look = BACKEND_STYLE.get(r["backend"], {})
        axes[0].step(xs, ys, where="post", label=r["backend"], **look)
        axes[1].step(ts, ys, where="post", label=r["backend"], **look)
    axes[0].set_xlabel("evaluations")
    axes[1].set_xlabel("wall time (s)")
    for ax in axes:
        ax.set_ylabel("best validation error (%)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(path)


if __name__ == "__main__":
    sys.exit(main())
