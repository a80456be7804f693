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


def candidates(
    points: list[dict[str, Any]], method: str, share: float, k: int
) -> list[dict[str, Any]]:
    """The method's `k` front points within `share` of DDP's bytes of best top-1 on the
    search's seed: the ones trained again at other seeds, the best of them by those."""
    inside = [
        p
        for p in points
        if p["method"] == method and p["front"] and p["bytes_vs_ddp"] <= share + 1e-9
    ]
    return sorted(inside, key=lambda p: -p["best_top1"])[:k]


def finish(points: list[dict[str, Any]], ddp: float, steps: int) -> list[dict[str, Any]]:
    """Each point's figures from its seeds, its share of DDP's bytes, its front."""
    for p in points:
        # top1[0] is the seed the search chose the point on: a point chosen as the best of
        # many on that seed is favoured by it, so where it was trained again at other
        # seeds its figure is theirs alone
        reruns = p["top1"][1:]
        p["search_top1"] = p["top1"][0]
        p["rerun_seeds"] = len(reruns)
        p["best_top1"] = statistics.fmean(reruns) if reruns else p["top1"][0]
        p["best_top1_sd"] = statistics.stdev(reruns) if len(reruns) > 1 else None
        p["bytes_vs_ddp"] = p["inter_node_bytes_per_rank"] / ddp
        p["steps"] = steps
    for p, front in zip(points, on_front(points)):
        p["front"] = front
    return points


# ---------------------------------------------------------------- how each search went
def hypervolume(points: list[tuple[float, float]]) -> float:
    """The area (share of DDP's bytes × top-1 points) that these (bytes share, top-1) points
    dominate against the reference (1.0, 0): more top-1 for fewer bytes fills more of it."""
    area, best = 0.0, 0.0
    for x, y in sorted((min(x, 1.0), max(y, 0.0)) for x, y in points):
        if y > best:  # from x on to the reference, this point raises the front to y
            area += (1.0 - x) * (y - best)
            best = y
    return area


def search_progress(
    runs_dir: Path, t: TradeoffConfig, ddp: float, ranks_per_worker: int
) -> list[dict[str, Any]]:
    """Each search's hypervolume after each of its evaluations (in the order they
    finished), where it last rose, and how much of the search was past its random start."""
    from bench.tradeoff.settings import startup_of

    out = []
    workers = max(1, t.ranks // ranks_per_worker)
    for m in t.methods:
        for backend, budget in searches_of(t, m):
            folder = folder_of(runs_dir, m, backend, budget)
            path = folder / "evaluations.jsonl"
            if not path.exists():
                continue
            rows = read_record_rows(path)
            seen: list[tuple[float, float]] = []
            curve = []
            for r in rows:
                if r["status"] == "ok" and r.get("inter_node_bytes") is not None:
                    seen.append((r["inter_node_bytes"] / ddp, 100.0 - min(r["errors"])))
                curve.append(hypervolume(seen))
            rises = [i for i in range(len(curve)) if curve[i] > (curve[i - 1] if i else 0.0)]
            n = len(rows)
            random_start = (
                startup_of(t, t.evaluations[backend][m]) if backend == "optuna" else 2 * workers
            )
            out.append(
                dict(
                    method=m,
                    backend=backend,
                    budget=budget,
                    evaluations=n,
                    random_start=min(random_start, n),
                    hypervolume=curve,
                    last_rise=rises[-1] + 1 if rises else None,
                    finished=len(seen),
                )
            )
    return out
