"""The study's state, committed beside its report (`reports/tradeoff/state/`): each search's
settings, rows, best, Optuna journal and Propulate checkpoints, and each seed run's point
and summary; the run folders' weights and logs stay on the machine that trained them. A
clone restores it into `runs/tradeoff/` and goes on from there: a search given more
evaluations trains only the new ones, a finished run is read back, not trained again."""

from __future__ import annotations

import filecmp
import fnmatch
import shutil
from pathlib import Path

from abtrain.files import atomic_write_bytes

STATE = Path("reports/tradeoff/state")
# what a search or a seed run needs to be resumed or read back, all small files
KEPT = (
    "search.json",
    "evaluations.jsonl",
    "best.json",
    "optuna.journal",
    "island_*_ckpt.pickle",
    "*.params.yaml",
    "point.json",
    "summary.json",
    "launch_seconds.txt",
)
SKIPPED = ("individuals",)  # a search's run folders: weights and logs of every evaluation


def kept(rel: Path) -> bool:
    return not set(rel.parts[:-1]) & set(SKIPPED) and any(
        fnmatch.fnmatch(rel.name, pattern) for pattern in KEPT
    )


def files(root: Path) -> list[Path]:
    """The state's files under `root`, relative to it."""
    if not root.is_dir():
        return []
    return sorted(
        p.relative_to(root) for p in root.rglob("*") if p.is_file() and kept(p.relative_to(root))
    )


def save(runs_dir: Path, state: Path = STATE) -> int:
    """Copy the state of `runs_dir` into `state` (each file whole); returns how many files
    changed."""
    changed = 0
    for rel in files(runs_dir):
        src, dst = runs_dir / rel, state / rel
        if dst.exists() and filecmp.cmp(src, dst, shallow=False):
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(dst, src.read_bytes())
        changed += 1
    return changed


def restore(runs_dir: Path, state: Path = STATE) -> int:
    """Copy into `runs_dir` the committed state it lacks (a fresh clone, another machine);
    a file the runs folder has is its own, newer; returns how many were restored."""
    restored = 0
    for rel in files(state):
        dst = runs_dir / rel
        if dst.exists():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(state / rel, dst)
        restored += 1
    return restored
