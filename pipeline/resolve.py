"""Stage `resolve`: every run of the matrix as the values it trains with, a file a run
(results/resolved/NAME.json, committed), which is all its train stage depends on besides the
code and the data.

A run's values come from several places (`train`, the matrix, experiments.schedule, the
search's best for the keys search.use_best names, the run's own `set`, experiments.set:
pipeline.matrix.resolve), so which keys of params.yaml a run reads depends on the profile.
Rather than list keys in dvc.yaml, the train stage depends on the outcome: an edit that
changes no run's values (a key every run takes from the search's best, such as
train.optim.lr, or a tracking setting) reruns this stage in seconds and trains nothing;
one that changes a run's values retrains that run alone. Settings that change nothing a run
trains (abtrain.config.NOT_TRAINING: where it reports, timeouts, checkpoints kept) are not
in the record, `tracking.ledger_rows` (which writes ledger.jsonl) aside.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from abtrain import config as abconfig
from abtrain.files import atomic_write_text, read_record
from pipeline.matrix import MatrixRun, best_config, resolve, runs, seeds
from pipeline.stage import SEARCHES, covered, params, parser, stage

RESOLVED = Path("results/resolved")


def record(p: dict[str, Any], run: MatrixRun, best: dict[str, Any] | None) -> dict[str, Any]:
    """What run `run` trains with: its place in the matrix, its seeds, each value not taken
    from `train` with its source, the whole config that results, and the search record its
    values come from (path and sha256)."""
    overrides = resolve(p, run, best)
    cfg = abconfig.from_dict(p["train"], [o.text for o in overrides]).dump()
    trained = _without(cfg, abconfig.NOT_TRAINING)
    trained["tracking"] = {"ledger_rows": cfg["tracking"]["ledger_rows"]}
    source = SEARCHES / p["search"]["backend"] / "best.json"
    return dict(
        name=run.name,
        method=run.method,
        nodes=run.nodes,
        ranks_per_node=run.ranks_per_node,
        batch=run.batch,
        seeds=seeds(p),
        overrides=[dict(key=o.key, value=o.value, source=o.source) for o in overrides],
        config=trained,
        search_record=dict(path=str(source), sha256=_sha256(source)) if best else None,
    )


def _without(node: dict[str, Any], keys: tuple[str, ...], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in node.items():
        dotted = f"{prefix}{k}"
        if covered(dotted, keys):
            continue
        out[k] = _without(v, keys, dotted + ".") if isinstance(v, dict) else v
    return out


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def path_of(name: str) -> Path:
    return RESOLVED / f"{name}.json"


def text(rec: dict[str, Any]) -> str:
    return json.dumps(rec, indent=2) + "\n"


def check(p: dict[str, Any], run: MatrixRun, best: dict[str, Any] | None) -> dict[str, Any]:
    """The run's committed record, refused (ConfigError) if params.yaml now gives the run
    other values: the train stage trains what DVC tracked, never something else."""
    path = path_of(run.name)
    now = record(p, run, best)
    if not path.exists() or read_record(path, remake="dvc repro resolve") != now:
        raise abconfig.ConfigError(
            f"{path} does not hold run {run.name} as params.yaml gives it now: make it with "
            "`dvc repro resolve` (dvc repro does, before any run)"
        )
    return now


def main() -> int:
    p = params()
    best = best_config(p)
    matrix = runs(p)
    for name, run in matrix.items():
        new = text(record(p, run, best))
        path = path_of(name)
        if not path.exists() or path.read_text() != new:
            atomic_write_text(path, new)
            print(f"[pipeline] resolve: {path}", flush=True)
    for old in RESOLVED.glob("*.json"):  # runs no longer in the matrix
        if old.stem not in matrix:
            old.unlink()
            print(f"[pipeline] resolve: removed {old} ({old.stem} left the matrix)", flush=True)
    print(f"[pipeline] resolve: {len(matrix)} runs, each one's values in {RESOLVED}/", flush=True)
    return 0


if __name__ == "__main__":
    parser("pipeline.resolve", __doc__).parse_args()
    sys.exit(stage(main))
