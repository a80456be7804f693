"""The search's command line, `mpirun ... python -m mpi4py -m search ARGS`, in one place for
the pipeline's stage on this machine, its SLURM batch script and the tests.

mpi4py's `-m` runner aborts the whole job when one rank raises, instead of leaving the
others blocked in a collective. Nothing here imports more than the standard library: the
pipeline's launchers build the line without loading the search.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path


def mpirun_command(ranks: int | str, args: Sequence[str], *, here: bool = True) -> list[str]:
    """`mpirun -n RANKS --bind-to none PYTHON -m mpi4py -m search ARGS`, one word an item.

    `here`: for this machine, this interpreter and the mpirun beside it, with
    `--oversubscribe` (more ranks than cores is fine); else (a batch script on the cluster's
    nodes) `mpirun` and `python` as the script's PATH finds them, one rank a slot.
    """
    if here:
        mpirun, python = str(Path(sys.executable).parent / "mpirun"), sys.executable
        placement = ["--oversubscribe", "--bind-to", "none"]
    else:
        mpirun, python, placement = "mpirun", "python", ["--bind-to", "none"]
    return [mpirun, "-n", str(ranks), *placement, python, "-m", "mpi4py", "-m", "search", *args]
