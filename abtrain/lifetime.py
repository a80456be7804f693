"""A child process's life tied to its parent's: nothing abtrain starts (a torchrun, a rank, a
rank's data workers, a stage's launcher, a search's mpirun) trains on once what started it
is gone, even when that was killed outright (SIGKILL, the OOM killer)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import threading


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


SHELLS = frozenset({"sh", "dash", "bash", "zsh", "ksh", "mksh", "fish", "busybox"})


def die_with_runner(sig: int) -> None:
    """As `die_with_parent`, but tied to what ran this process's command line: where a shell
    ran it (`sh -c CMD`, as DVC runs a stage) and stayed as its parent (dash, DVC's shell when
    $SHELL is unset, does not exec a lone command), the shell's parent. A shell lives on when
    its own parent is killed, so a tie to it alone would leave this process running.

    Linux 5.3+ (pidfd); elsewhere only the parent tie."""
    die_with_parent(sig)
    shell = os.getppid()
    if _comm(shell) not in SHELLS:
        return
    runner = _parent_of(shell)
    try:
        fd = os.pidfd_open(runner)
    except (OSError, AttributeError):
        return
    if _parent_of(shell) != runner:  # the runner died before the watch began
        os._exit(128 + int(sig))
    threading.Thread(target=_signal_on_exit, args=(fd, sig), daemon=True).start()


def _signal_on_exit(fd: int, sig: int) -> None:
    select.select([fd], [], [])  # a pidfd reads ready when its process has ended
    os.kill(os.getpid(), sig)


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _parent_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            # the name, field 2, is in parentheses and may hold spaces; the parent is field 4
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0
