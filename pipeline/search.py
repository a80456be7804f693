"""Stage `search@BACKEND`: the hyperparameter search under mpirun, in runs/search/BACKEND,
on this machine or as one SLURM job (experiments.launcher).

A folder left by a killed attempt is resumed; if the search refuses (its settings changed,
which is why the stage reruns), the folder is cleared and the search starts afresh.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from pipeline.common import RUNS, params


def main(backend: str) -> int:
    p = params()
    out = RUNS / "search" / backend
    args = ["--backend", backend, "--out", str(out.resolve())]
    if p["experiments"]["launcher"] == "slurm":
        from pipeline.slurm import run_search

        def start(extra: list[str]) -> int:
            return run_search(p, args + extra, out)
    else:
        cmd = [
            str(Path(sys.executable).parent / "mpirun"),
            "-n",
            str(p["search"]["ranks"]),
            "--oversubscribe",
            "--bind-to",
            "none",
            sys.executable,
            "-m",
            "mpi4py",
            "-m",
            "search",
            *args,
        ]
        env = dict(os.environ)
        if os.geteuid() == 0:  # Open MPI refuses root unless told
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")

        def start(extra: list[str]) -> int:
            return subprocess.run(cmd + extra, env=env).returncode

    if (out / "search.json").exists() and not (out / "best.json").exists():
        if start(["--resume"]) == 0:
            return 0
        print(f"[pipeline] could not resume {out}: starting the search afresh", flush=True)
    shutil.rmtree(out, ignore_errors=True)
    return start([])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
