"""Atomic files and resumable checkpoints.

Each rank saves its own state (in an AB phase the replicas differ on purpose) to
`DIR/checkpoints/step_NNNNNNNN/rank_R.pt`; rank 0 then points `LATEST` at that folder,
after every rank has finished, so a run killed at any moment resumes from a whole one.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write via a temporary file, fsync and rename: a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_save(obj: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:08d}"


def save_rank(root: Path, step: int, rank: int, state: dict[str, Any]) -> None:
    atomic_save(state, step_dir(root, step) / f"rank_{rank}.pt")


def publish(root: Path, step: int, keep: int) -> None:
    """Rank 0, once every rank has saved `step`: make it the one to resume from."""
    atomic_write_text(root / "LATEST", f"{step}\n")
    done = sorted(p for p in root.glob("step_*") if p.is_dir())
    for old in done[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def latest_step(root: Path) -> int | None:
    marker = root / "LATEST"
    if not marker.exists():
        return None
    text = marker.read_text().strip()
    try:
        return int(text)
    except ValueError:
        raise RuntimeError(f"{marker} is corrupt: {text!r} is not a step number") from None


def load_rank(root: Path, step: int, rank: int) -> dict[str, Any]:
    path = step_dir(root, step) / f"rank_{rank}.pt"
    if not path.exists():
        raise RuntimeError(
            f"{path} is missing: the checkpoint was written by a different world size "
            "or has been removed"
        )
    return torch.load(path, map_location="cpu", weights_only=True)


def diff_keys(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two nested dicts."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += diff_keys(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}")
    return out
