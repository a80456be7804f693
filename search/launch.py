"""The search's command line, `mpirun ... python -m mpi4py -m search ARGS`, in one place for
the pipeline's stage on this machine, its SLURM batch script and the tests; and the process
that runs it and says how far a search stopped from outside got.

mpi4py's `-m` runner aborts the whole job when one rank raises, instead of leaving the
others blocked in a collective. Nothing here imports torch or the search at import time:
the pipeline's launchers build the line without loading the search.

`python -m search.launch MPIRUN_COMMAND...` runs an mpirun command as `run` does: a SLURM
job's batch script runs its search through it, so a job cancelled from outside (`scancel`)
ends its log with the stop line too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from abtrain.lifetime import die_with_parent

# Open MPI yields when idle on an oversubscribed machine; by default with sched_yield, which
# on Linux keeps the waiting rank spinning (a core's worth of CPU while its peer evaluates)
YIELD_BY_SLEEPING = {
    "threads_pthreads_yield_strategy": "nanosleep",
    "threads_pthreads_nanosleep_time": "1000000",  # 1 ms
}


def mpirun_command(ranks: int | str, args: Sequence[str], *, here: bool = True) -> list[str]:
    """`mpirun -n RANKS --bind-to none PYTHON -m mpi4py -m search ARGS`, one word an item.

    `here`: for this machine, this interpreter and the mpirun beside it (pip's Open MPI 5),
    with `--oversubscribe` (more ranks than cores is fine) and a rank that waits on the
    others (while one evaluates, or talks to the store) sleeping a millisecond between
    looks instead of spinning a core the evaluating rank needs (docs/testing.md measures
    it); else (a batch script on the cluster's nodes) `mpirun` and `python` as the script's
    PATH finds them, one rank a slot.
    """
    if here:
        mpirun, python = str(Path(sys.executable).parent / "mpirun"), sys.executable
        placement = ["--oversubscribe", "--bind-to", "none"]
        for key, value in YIELD_BY_SLEEPING.items():
            placement += ["--mca", key, value]
    else:
        mpirun, python, placement = "mpirun", "python", ["--bind-to", "none"]
    return [mpirun, "-n", str(ranks), *placement, python, "-m", "mpi4py", "-m", "search", *args]


def run_mpirun(ranks: int, args: list[str]) -> int:
    """`python -m search ARGS` on `ranks` MPI ranks of this machine; its exit code."""
    return run(mpirun_command(ranks, args))


def run(cmd: list[str]) -> int:
    """The mpirun command `cmd`, to its end; its exit code. A SIGTERM or SIGHUP to this
    process is passed on to mpirun (which stops its ranks) and ends in `stopped_line`."""
    env = dict(os.environ)
    if os.geteuid() == 0:  # Open MPI refuses root unless told
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    # Open MPI keeps its session files in $TMPDIR/ompi.<mpirun's pid>, and an mpirun killed
    # outright leaves them there: a later mpirun given the same pid by the kernel fails on
    # them ("The PMIx server's listener thread failed to start", exit 213). Each mpirun
    # gets a folder of its own (other nodes' daemons create the same path, and leave it).
    with tempfile.TemporaryDirectory(prefix="search-mpirun-", ignore_cleanup_errors=True) as tmp:
        return _run_to_end(cmd, {**env, "TMPDIR": tmp})


def _run_to_end(cmd: list[str], env: dict[str, str]) -> int:
    # mpirun goes when its parent goes, by any signal (SIGTERM: it stops its ranks), and
    # holds what the parent holds (a study's lock, `abtrain.files.hold`) until it is gone
    proc = subprocess.Popen(
        cmd, env=env, close_fds=False, preexec_fn=lambda: die_with_parent(signal.SIGTERM)
    )
    got: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        got.append(signum)
        proc.send_signal(signal.SIGTERM)  # mpirun stops its ranks

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        code = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if got:
        print(stopped_line(signal.Signals(got[0]).name, cmd), file=sys.stderr, flush=True)
        return 128 + got[0]
    return code


def stopped_line(signal_name: str, args: Sequence[str]) -> str:
    """The last line of a search stopped from outside: how far it got and how to go on (the
    ranks' own last words are lost: mpirun stops forwarding their output as it stops)."""
    from search import record

    out = Path(args[list(args).index("--out") + 1])
    try:
        done = f"{len(record.evaluations(out))} evaluations, kept in {out}"
    except (OSError, record.SearchError):
        done = f"its evaluations kept in {out}"
    return f"[search] stopped by {signal_name} after {done}: the same command continues it"


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python -m search.launch MPIRUN_COMMAND... (e.g. mpirun -n 4 ...)")
    sys.exit(run(sys.argv[1:]))
