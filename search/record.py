"""What a search leaves behind: its state file, every evaluation, the best configuration,
and MLflow (a parent run per search, a child run per individual or trial)."""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from abtrain.config import diff_keys
from abtrain.files import write_record
from abtrain.tracking.nested import NestedRuns

EVALUATIONS = "evaluations.jsonl"
STATUSES = ("ok", "pruned", "diverged", "crashed", "invalid")


class SearchError(RuntimeError):
    pass


# the search settings a resume may change: the budget, and with it Optuna's random start
# (it only moves where TPE begins); a search.json written before they were left out of
# the identity still holds them
MAY_GROW = ("evaluations", "startup_trials")


def settings_differ(saved: dict[str, Any], state: dict[str, Any]) -> list[str]:
    """Dotted keys of `state` that the saved search.json holds otherwise (or not at all)."""
    state = json.loads(json.dumps(state))  # compare as it will read back from disk
    old = {k: saved.get(k) for k in state}
    if isinstance(old.get("search"), dict):
        old["search"] = {k: v for k, v in old["search"].items() if k not in MAY_GROW}
    return diff_keys(old, state)


def open_search(out: Path, state: dict[str, Any], resume: bool) -> dict[str, Any]:
    """Rank 0: start a search in `out`, or check that `--resume` continues the same one.

    A resume also mends `evaluations.jsonl` before any worker appends to it.
    """
    path = out / "search.json"
    if path.exists():
        if not resume:
            raise SearchError(
                f"{out} already holds a search: pass --resume to continue it, or choose a new --out"
            )
        saved = json.loads(path.read_text())
        differ = settings_differ(saved, state)
        if differ:
            raise SearchError(
                f"{out} holds a search with other settings ({', '.join(differ)} differ): "
                "its checkpoints don't fit this run"
            )
        mended = repair_evaluations(out)
        if mended:
            print(f"[search] {mended}", file=sys.stderr, flush=True)
        return saved
    if resume:
        raise SearchError(f"--resume: {out} holds no search to resume")
    state = {**state, "started": time.time()}
    write_record(path, state)
    return state


@dataclass
class _Torn:
    line: int  # 1-based, for the message
    offset: int  # where the torn line starts: everything before it is whole rows


def _parse(path: Path, data: bytes) -> tuple[list[dict[str, Any]], _Torn | None]:
    """The rows of an evaluations file, and its torn last line if a crash left one.

    Only the last line can be torn (every append is one whole line, under a lock), so a bad
    line anywhere else is damage no crash explains, and an error.
    """
    lines = data.split(b"\n")
    filled = [i for i, line in enumerate(lines) if line.strip()]
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line) + 1)
    rows = []
    for i in filled:
        try:
            row = json.loads(lines[i].decode("utf-8", "replace"))
            if not isinstance(row, dict) or "id" not in row:
                raise ValueError("not an evaluation row")
        except ValueError as err:
            if i == filled[-1]:
                return rows, _Torn(i + 1, offsets[i])
            raise SearchError(
                f"{path}:{i + 1}: not a whole evaluation ({getattr(err, 'msg', err)}); a crash "
                "can only cut off the last line, so this file is damaged: mend or remove that "
                "line, then resume"
            ) from None
        rows.append(row)
    return rows, None


def _read(fd: int) -> bytes:
    size, chunks, at = os.fstat(fd).st_size, [], 0
    while at < size:
        chunk = os.pread(fd, size - at, at)
        if not chunk:
            break
        chunks.append(chunk)
        at += len(chunk)
    return b"".join(chunks)


def _mend(fd: int, path: Path) -> str | None:
    """With the exclusive lock held: cut a torn last line off, or end a whole one that lacks
    its newline, so that the next append starts a line of its own."""
    data = _read(fd)
    _, torn = _parse(path, data)
    if torn is not None:
        os.ftruncate(fd, torn.offset)  # one call: the file is either as it was or cut
        os.fsync(fd)
        cut = len(data) - torn.offset
        return (
            f"{path}:{torn.line}: cut off a torn last line ({cut} bytes of a write that a "
            "crash interrupted)"
        )
    if data and not data.endswith(b"\n"):
        _write_all(fd, b"\n")
        os.fsync(fd)
    return None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:  # one write in practice; a short one (a full disk) goes on where it stopped
        view = view[os.write(fd, view) :]


def repair_evaluations(out: Path) -> str | None:
    """Make `evaluations.jsonl` end on a whole line; what was cut, if anything, for the log.

    Raises SearchError, naming the file and line, when a line other than the last is bad.
    """
    path = out / EVALUATIONS
    if not path.exists():
        return None
    fd = os.open(path, os.O_RDWR | os.O_APPEND)  # a newline it adds goes at the end
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return _mend(fd, path)
    finally:
        os.close(fd)  # and with it the lock


def append_evaluation(out: Path, row: dict[str, Any]) -> None:
    """One whole line per evaluation, synced before the lock is let go.

    The lock, not O_APPEND alone, keeps workers' lines apart: O_APPEND is not atomic on NFS,
    and a reader holding the shared lock never sees half an append.
    """
    path = out / EVALUATIONS
    line = (json.dumps(row) + "\n").encode()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":  # resume mends this; never append to it
            mended = _mend(fd, path)
            if mended:
                print(f"[search] {mended}", file=sys.stderr, flush=True)
        _write_all(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def evaluations(out: Path) -> list[dict[str, Any]]:
    """Every evaluation, once: an individual evaluated again after a resume (Propulate's
    checkpoint can lag its last results) keeps its latest row.

    A torn last line is left out (and reported), not mended: readers don't write.
    """
    path = out / EVALUATIONS
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return []
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        data = _read(fd)
    finally:
        os.close(fd)
    parsed, torn = _parse(path, data)
    if torn is not None:
        print(
            f"[search] {path}:{torn.line}: torn last line (a write that a crash interrupted), "
            "left out; --resume cuts it off",
            file=sys.stderr,
            flush=True,
        )
    rows = {}
    for row in parsed:
        rows.pop(row["id"], None)
        rows[row["id"]] = row
    return list(rows.values())


def write_best(out: Path) -> dict[str, Any]:
    every = evaluations(out)
    rows = [r for r in every if r["status"] in ("ok", "pruned")]
    if not rows:
        raise SearchError(f"{out}: no individual finished, so there is no best configuration")
    finished = [r for r in rows if r["status"] == "ok"] or rows
    best = min(finished, key=lambda r: r["error"])
    errors = sorted(r["error"] for r in finished)
    result = dict(
        backend=best["backend"],
        id=best["id"],
        error=best["error"],
        median_error=errors[len(errors) // 2],
        evaluations=len(every),
        params=best["params"],
        overrides=best["overrides"],
    )
    write_record(out / "best.json", result)
    return result


def search_experiment(runs_experiment: str) -> str:
    """The MLflow experiment of the searches whose runs log to `runs_experiment`."""
    return f"{runs_experiment}-search"


class SearchRuns:
    """The search's MLflow runs: a parent for the search, a child for each individual or
    trial (`abtrain.tracking.nested`). Only worker roots call it; none of it is collective.
    (abtrain.tracking.tracker.Tracker is a training run's own.)"""

    def __init__(self, uri: str | None, experiment: str, enabled: bool) -> None:
        self.runs = NestedRuns(uri, experiment) if enabled else None
        self.client = self.runs.client if self.runs else None

    @property
    def experiment_id(self) -> str | None:
        return self.runs.experiment_id if self.runs else None

    def parent(self, name: str, params: dict[str, Any], run_id: str | None) -> str:
        """Rank 0: the search's run (reopened on resume, its stale children marked KILLED)."""
        if self.runs is None:
            return ""
        if not run_id:
            return self.runs.parent(name, params)
        self.runs.made()
        self.client.update_run(run_id, status="RUNNING")
        for run in self.runs.children(run_id, "attributes.status = 'RUNNING'"):
            self.client.set_terminated(run.info.run_id, status="KILLED")
        return run_id

    def child(self, parent: str, name: str, tags: dict[str, Any], hp: dict[str, Any]) -> str:
        return self.runs.child(parent, name, tags, hp) if self.runs else ""

    def finish_child(self, run_id: str, outcome: Any) -> None:
        if self.client is None:
            return
        for i, err in enumerate(outcome.errors):
            self.client.log_metric(run_id, "val_error", err, step=i)
        self.client.log_metric(run_id, "objective", outcome.error)
        self.client.set_tag(run_id, "status", outcome.status)
        self.client.set_tag(run_id, "pruned", str(outcome.status == "pruned").lower())
        status = "FINISHED" if outcome.status in ("ok", "pruned") else "FAILED"
        self.client.set_terminated(run_id, status=status)

    def finish_parent(self, run_id: str, best: dict[str, Any] | None) -> None:
        """The search's outcome on its run: the best error, the best child's values as
        `best.<key>` tags (tags: a resumed search may find another best), and a link to it."""
        if self.client is None or not run_id:
            return
        if best:
            self.client.log_metric(run_id, "best_error", best["error"])
            self.client.log_metric(run_id, "median_error", best["median_error"])
            tags = {f"best.{k}": str(v) for k, v in best["params"].items()}
            tags["best.id"] = best["id"]
            tags["best.overrides"] = " ".join(best["overrides"])
            child = self.best_child(run_id, best["id"])
            if child:
                link = f"#/experiments/{self.experiment_id}/runs/{child}"
                tags["best.run_id"] = child
                tags["mlflow.note.content"] = (
                    f"Best: {best['id']}, error {best['error']:.2f}% (median "
                    f"{best['median_error']:.2f}% of {best['evaluations']} evaluations): "
                    f"[its run]({link}). Values: {tags['best.overrides']}"
                )
            for k, v in tags.items():
                self.client.set_tag(run_id, k, v[:5000])
        self.client.set_terminated(run_id, status="FINISHED")

    def best_child(self, parent: str, name: str) -> str | None:
        """The child run of `name` under `parent`: its finished one, the latest if an
        individual was evaluated again after a resume."""
        runs = self.runs.children(
            parent, f"attributes.run_name = '{name}'", order_by=["attributes.start_time DESC"]
        )
        finished = [r for r in runs if r.info.status == "FINISHED"] or runs
        return finished[0].info.run_id if finished else None
