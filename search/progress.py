"""What a search prints: every line whole and tagged with the worker (and rank) that wrote it.

mpirun merges the ranks' output as it arrives, in whatever pieces each pipe delivers; a line
written in one call and flushed at once arrives whole. The tag goes on every line a rank
writes through Python (its own progress, the trainer's log, a traceback), so interleaved
workers stay apart.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO


class Prefixed(io.TextIOBase):
    """A text stream that writes each complete line, tagged, in one write and flushes it."""

    def __init__(self, stream: TextIO, tag: str) -> None:
        self.stream, self.tag, self.pending = stream, tag, ""

    def write(self, text: str) -> int:
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            self.stream.write(f"{self.tag} {line}\n")
            self.stream.flush()
        return len(text)

    def flush(self) -> None:
        self.stream.flush()  # a partial line waits for its end: it would be cut in two

    def close_line(self) -> None:
        if self.pending:
            self.write("\n")

    def isatty(self) -> bool:
        return False  # no redrawn progress bars: their \r would be tagged mid-line

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "encoding", "utf-8")


def tag_for(rank: int, ranks_per_worker: int) -> str:
    """`[search w1]` on a worker's first rank (the one that reports), `[search w1 r3]` on
    its other ranks, which speak only on error."""
    worker = rank // ranks_per_worker
    return f"[search w{worker}]" if rank % ranks_per_worker == 0 else f"[search w{worker} r{rank}]"


@contextmanager
def tagged(tag: str) -> Iterator[None]:
    """stdout and stderr tagged for the duration (restored after: tests call main in-process)."""
    saved = sys.stdout, sys.stderr
    out, err = Prefixed(sys.stdout, tag), Prefixed(sys.stderr, tag)
    sys.stdout, sys.stderr = out, err
    try:
        yield
    finally:
        out.close_line()
        err.close_line()
        sys.stdout, sys.stderr = saved
