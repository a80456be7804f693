"""Files that are whole or absent: atomic writes and append-only logs.

Every result, record and checkpoint file in abtrain, the pipeline, the search and the
benchmarks is written through here, so a crash or a full disk never leaves half a file.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import filelock


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


def write_record(
    path: str | Path, record: Any, *, indent: int | None = 2, end: str = "", **dumps: Any
) -> None:
    """`record` as JSON, written atomically: the twin of `read_record`. `end` follows the
    JSON ("\\n" for a file people read and diff), `dumps` goes to json.dumps."""
    atomic_write_text(path, json.dumps(record, indent=indent, **dumps) + end)


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


# ---------------------------------------------------------------- records a stage reads
class RecordError(ValueError):
    """A record a stage or study reads is damaged: named, with the command that restores
    it (one line; a stage ends with it, exit code 2)."""


def restore_hint(path: Path, remake: str | None = None) -> str:
    """How to get `path` back: git's committed copy where git tracks it, else `remake`."""
    import subprocess

    try:
        tracked = (
            subprocess.run(
                ["git", "ls-files", "--error-unmatch", path.name],
                cwd=path.parent,
                capture_output=True,
                timeout=30,
            ).returncode
            == 0
        )
    except (OSError, subprocess.SubprocessError):
        tracked = False
    if tracked:
        return f"restore the committed copy: git checkout -- {path}"
    return remake or "it is not in git: run again what writes it"


def damaged(path: Path, why: str, remake: str | None = None) -> RecordError:
    return RecordError(f"{path} is damaged ({why}); {restore_hint(path, remake)}")


def read_record(
    path: str | Path, keys: tuple[str, ...] = (), remake: str | None = None, shape: type = dict
) -> Any:
    """A JSON record that a stage or study reads: an object with `keys` at its top level (or
    a list, `shape=list`). Damage (not JSON, cut short, another shape, a key missing) is a
    RecordError naming the file and how to restore it; a missing file is
    FileNotFoundError, as ever."""
    import json

    path = Path(path)
    data = path.read_bytes()
    try:
        record = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise damaged(path, "not UTF-8 text", remake) from None
    except json.JSONDecodeError as err:
        where = f"line {err.lineno}, column {err.colno}"  # err.msg may end in "at"
        what = "empty" if not data.strip() else f"not whole JSON: {err.msg} ({where})"
        raise damaged(path, what, remake) from None
    if not isinstance(record, shape):
        want = "an object" if shape is dict else f"a {shape.__name__}"
        raise damaged(path, f"a JSON {type(record).__name__}, not {want}", remake)
    missing = [k for k in keys if k not in record]
    if missing:
        raise damaged(path, f"no {missing[0]!r} in it", remake)
    return record


def read_record_rows(path: str | Path, keys: tuple[str, ...] = (), remake: str | None = None):
    """A JSON-lines record: every line an object holding `keys`; RecordError names the
    first line that is not (a committed record is written whole, so no line may be torn)."""
    import json

    path = Path(path)
    rows = []
    for i, line in enumerate(path.read_bytes().split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise damaged(path, f"line {i} is not a whole JSON row", remake) from None
        if not isinstance(row, dict) or any(k not in row for k in keys):
            raise damaged(path, f"line {i} is not a row of it", remake)
        rows.append(row)
    return rows


def take_folder(out: Path) -> tuple[filelock.FileLock | None, str]:
    """Rank 0: the run folder's lock, held until this process exits, so that a second
    launch into the folder is refused; or the error saying who holds it."""
    out.mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(out / ".lock")
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        return None, f"{out} is in use by another run (it holds {out / '.lock'})"
    return lock, ""


def hold(path: Path) -> int | None:
    """An exclusive lock on `path` (created if absent) for as long as this process, or a
    child it starts with the descriptor (`close_fds=False`), lives: the descriptor, or None
    when another holds it. A process killed by any signal lets go with its last holder."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.set_inheritable(fd, True)  # a study's mpirun keeps it held until it is gone too
    return fd


def held(path: Path) -> bool:
    """Another process holds the lock on `path` (`hold`, or a run folder's `take_folder`)."""
    if not path.exists():
        return False
    fd = hold(path)
    if fd is None:
        return True
    os.close(fd)
    return False
