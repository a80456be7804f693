"""Files that are whole or absent: atomic writes and append-only logs.

Every result, record and checkpoint file in abtrain, the pipeline, the search and the
benchmarks is written through here, so a crash or a full disk never leaves half a file.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path


def write_failed(err: OSError, path: Path) -> OSError:
    """The same error, naming the file and the cause (a full disk: ENOSPC)."""
    code = errno.errorcode.get(err.errno or 0, "")
    why = f"{err.strerror or err}{f' ({code})' if code else ''}"
    return OSError(err.errno, f"could not write {path}: {why}")


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write via a temporary file of this process, fsync and rename: a reader never sees
    half a file, two writers never share a temporary, and a write that fails leaves no
    temporary file behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise write_failed(err, path) from None
    os.replace(tmp, path)


def atomic_write_text(path: str | Path, text: str) -> None:
    """`atomic_write_bytes` of `text` in UTF-8."""
    atomic_write_bytes(path, text.encode())


def append_lines(path: Path, lines: list[str], header: str | None = None) -> None:
    """Append whole lines, on disk before returning; a new file starts with `header`."""
    if not lines:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists()
    try:
        with open(path, "a") as f:
            if new and header:
                f.write(header + "\n")
            f.write("".join(line + "\n" for line in lines))
            f.flush()
            os.fsync(f.fileno())
    except OSError as err:  # a resume cuts a torn last line (cut_after)
        raise write_failed(err, path) from None


def csv_step(line: str) -> int | None:
    """The step in a CSV log line's first column; None for a header or a torn line."""
    head = line.split(",", 1)[0]
    return int(head) if head.isdigit() else None


def cut_after(path: Path, cutoff: int, step_of: Callable[[str], int | None], header: bool) -> None:
    """Keep the lines of an append-only log whose step is below `cutoff` (what a checkpoint
    at `cutoff` had seen); lines written after it, or torn by a crash, go."""
    if not path.exists():
        return
    lines = path.read_text().splitlines()
    head = lines[:1] if header else []
    kept = [ln for ln in lines[len(head) :] if (s := step_of(ln)) is not None and s < cutoff]
    atomic_write_text(path, "".join(ln + "\n" for ln in head + kept))
