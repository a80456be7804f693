"""Stage `search@BACKEND`: the hyperparameter search under mpirun, in runs/search/BACKEND,
on this machine or as one SLURM job (experiments.launcher).

A search folder with the same settings is resumed (a killed attempt, or a larger budget).
One with other settings (why the stage reruns) is moved aside to a timestamped sibling and
the search starts afresh. A resume that fails fails the stage and leaves the folder as it is:
no finished evaluation is ever deleted here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from pipeline.common import RUNS, params


def differing(args: list[str], ranks: int) -> list[str] | None:
    """The settings that keep the folder's search from resuming; None when that can't be told,
    in which case the driver's own check decides (and names the reason)."""
    from abtrain.config import ConfigError
    from search.driver import differing_settings
    from search.space import SpaceError

    try:
        return differing_settings(args, ranks)
    except (SpaceError, ConfigError, OSError, ValueError) as err:
        print(f"[pipeline] can't compare the settings ({err}): trying --resume", flush=True)
        return None


def move_aside(out: Path) -> Path:
    """Rename `out` to a timestamped sibling, which nothing here ever deletes."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    backup = out.with_name(f"{out.name}.moved-{stamp}")
    n = 1
    while backup.exists():
        n += 1
        backup = out.with_name(f"{out.name}.moved-{stamp}-{n}")
    os.rename(out, backup)
    return backup


def main(backend: str) -> int:
    p = params()
    out = (RUNS / "search" / backend).resolve()  # messages name the folder in full
    args = ["--backend", backend, "--out", str(out)]
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

    if (out / "search.json").exists():
        differ = differing(args, int(p["search"]["ranks"]))
        if not differ:
            code = start(["--resume"])
            if code != 0:
                print(
                    f"[pipeline] error: could not resume the search in {out} (exit {code}, the "
                    "reason is above); the folder is left as it is, with every finished "
                    "evaluation: fix the cause and run the stage again, or move the folder "
                    "away to start afresh",
                    file=sys.stderr,
                    flush=True,
                )
            return code
        backup = move_aside(out)
        print(
            f"[pipeline] {out} holds a search with other settings ({', '.join(differ)}): "
            f"moved it to {backup}, starting afresh",
            flush=True,
        )
    elif out.exists() and any(out.iterdir()):
        backup = move_aside(out)  # not a search the driver could resume or start over
        print(f"[pipeline] {out} holds no search.json: moved it to {backup}", flush=True)
    return start([])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
