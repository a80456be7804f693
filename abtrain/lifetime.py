"""A child process's life tied to its parent's: nothing abtrain starts (a torchrun, a rank, a
rank's data workers, a stage's launcher, a search's mpirun) trains on once what started it
is gone, even when that was killed outright (SIGKILL, the OOM killer)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os


def die_with_parent(sig: int) -> None:
    """Linux: deliver `sig` to this process when the process that started it dies (prctl's
    PR_SET_PDEATHSIG); elsewhere nothing. If that parent is already gone, exit now.

    The kernel sends it when the parent's creating *thread* ends, so call it only in a child
    started from a thread that lives as long as its process (a main thread)."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, int(sig), 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died before the request took
        os._exit(128 + int(sig))
