"""The points the searches found, and their fronts: which point no other of its method
beats on both accuracy and bytes, the best within a budget."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from abtrain.files import read_record_rows
from bench.tradeoff.settings import TradeoffConfig, folder_of, searches_of


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
