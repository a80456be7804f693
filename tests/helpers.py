"""What the tests share: the repository's paths, a tiny config and run, real multi-process
runs (`spawn` on gloo ranks, `launch` through the launcher), and the check that a test
carries the marks of what it starts (the tiers: pyproject.toml; conftest.py applies it)."""

from __future__ import annotations

import json
import os
import queue as queues
import subprocess
import sys
import tempfile
import typing
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from abtrain.commands.localrun import cores_each

ROOT = Path(__file__).resolve().parents[1]
PARAMS = ROOT / "params.yaml"

# A run small enough for CI: 40 steps of a 3-layer MLP on generated data, every phase visited.
TINY = [
    "steps=40",
    "batch_size=16",
    "eval_every=10",
    "checkpoint_every=10",
    "model={name: mlp, width: 64, depth: 3, init: default}",
    "data={name: synthetic, features: 64, classes: 10, train_samples: 2000, val_samples: 400}",
    "optim.lr_warmup_steps=4",
    "ab.warmup_steps=8",
    "ab.ab_steps=8",
    "ab.rebound_steps=3",
    "ab.lr_rebound_steps=4",
    "powersgd.start_iter=5",
    "powersgd.rank=2",
    "tracking.enabled=false",
    "tracking.ledger_rows=true",
]


def tiny_config(*overrides: str):
    from abtrain import config

    return config.load(PARAMS, [*TINY, *overrides])


def launch(
    out: Path,
    *overrides: str,
    nnodes: int = 2,
    nproc: int = 2,
    env: dict | None = None,
    timeout: float = 240,
) -> subprocess.CompletedProcess:
    """`python -m abtrain.launch` for real: nnodes torchrun processes on this machine."""
    cmd = [
        sys.executable,
        "-m",
        "abtrain.launch",
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc}",
        "train",
        "--config",
        str(PARAMS),
        "--out",
        str(out),
    ]
    for o in [*TINY, *overrides]:
        cmd += ["--set", o]
    return subprocess.run(
        cmd,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def _worker(rank, world, nodes, init_file, fn, args, queue):
    import torch
    import torch.distributed as dist

    # the cores shared out as the launcher shares them (OMP_NUM_THREADS): ranks with a
    # thread per core each, on 2 cores, spun in OpenMP's barriers; an SVD of a small layer
    # took 0.44 s instead of 4 ms, and the timm families 94 s
    torch.set_num_threads(cores_each(world))
    os.environ["GROUP_RANK"] = str(nodes[rank])
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        queue.put((rank, fn(rank, world, *args)))
    except BaseException as err:  # report, so the parent doesn't wait forever
        queue.put((rank, err))
        raise
    finally:
        dist.destroy_process_group()


# The longest spawn() waits for the next rank's result: a guard against a hung rank, not a
# speed target. The timm families take about 90 s of it on CI's 2 cores, more when loaded.
RANK_TIMEOUT_S = 300


def spawn(fn, world: int = 4, ranks_per_node: int = 2, args: tuple = ()) -> list:
    """Run fn(rank, world, *args) on `world` real gloo ranks; returns each rank's result."""
    require_marks({"multiprocess"}, f"spawn({getattr(fn, '__name__', fn)}, world={world})")
    nodes = [r // ranks_per_node for r in range(world)]
    # forked from a server that imported torch once for this test process: a rank started
    # afresh spends 3 s of a CI core importing it, and these tests start some forty
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["tests.helpers", "torch._dynamo"])
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as d:
        procs = [
            ctx.Process(target=_worker, args=(r, world, nodes, f"{d}/init", fn, args, queue))
            for r in range(world)
        ]
        for p in procs:
            p.start()
        results = {}
        try:
            while len(results) < world:
                try:
                    rank, res = queue.get(timeout=RANK_TIMEOUT_S)
                except queues.Empty:
                    missing = sorted(set(range(world)) - set(results))
                    raise AssertionError(
                        f"spawn({getattr(fn, '__name__', fn)}): rank(s) {missing} of {world} "
                        f"gave no result within {RANK_TIMEOUT_S} s"
                    ) from None
                results[rank] = res
        finally:
            for p in procs:
                p.join(timeout=60 if len(results) == world else 1)
                if p.is_alive():  # a rank that hangs: ours, so stop it
                    p.kill()
                    p.join()
    for r, res in results.items():
        if isinstance(res, BaseException):
            raise AssertionError(f"rank {r} failed: {res!r}")
    return [results[r] for r in range(world)]


# ---------------------------------------------------------------- the tiers' marks
_PROGRAMS = {
    "multiprocess": {"torchrun", "mpirun", "mpiexec"},
    "cluster": {"slurmctld", "slurmd", "sbatch", "srun", "salloc", "squeue", "scancel"}
    | {"scontrol", "sinfo"},
    "browser": {"chromium", "chromium-browser", "google-chrome"},
    "pipeline": {"dvc"},
}
_MODULES = {  # python -m MODULE
    "multiprocess": ("abtrain.launch", "torch.distributed.run"),
    "pipeline": ("pipeline.",),
}
running: pytest.Item | None = None  # the test being set up, run or torn down (conftest.py)


def _words(args) -> list[str]:
    if isinstance(args, (str, bytes)):
        return os.fsdecode(args).split()
    if isinstance(args, os.PathLike):
        return [os.fspath(args)]
    return [os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else str(a) for a in args]


def marks_needed(args) -> set[str]:
    """The marks a test needs to start the command `args` (a list, or a shell string)."""
    words = _words(args)
    names = {os.path.basename(w) for w in words}
    modules = [b for a, b in zip(words, words[1:]) if a == "-m"]
    need = {mark for mark, programs in _PROGRAMS.items() if names & programs}
    for mark, prefixes in _MODULES.items():
        if any(m == p or (p.endswith(".") and m.startswith(p)) for m in modules for p in prefixes):
            need.add(mark)
    return need


def require_marks(need: set[str], what: str) -> None:
    item = running
    if item is None or not need:
        return
    have = {m.name for m in item.iter_markers()}
    if need - have:
        missing = sorted(need - have)
        pytest.fail(
            f"{item.nodeid} starts {what} but is not marked {' and '.join(missing)}: add "
            f"@pytest.mark.{' and @pytest.mark.'.join(missing)} (or a module's "
            "pytestmark), else it runs in the fast tier (markers: pyproject.toml)"
        )


class Proc(typing.NamedTuple):
    parent: int
    session: int
    command: str
    name: str  # /proc/PID/comm: a rank the launcher forked is "abtrain rank N" (localrun)

    def is_rank(self) -> bool:
        """A rank of `python -m abtrain train`: started afresh (its command line says so;
        torchrun's own names the command it runs) or forked by the launcher."""
        fresh = "abtrain train" in self.command and "distributed.run" not in self.command
        return fresh or self.name.startswith("abtrain rank")


def processes() -> dict[int, Proc]:
    """Every live process (zombies aside): pid -> its parent, session and command line, for
    the tests that kill a parent and look for what it started."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            name, rest = stat.read_text().split("(", 1)[1].rsplit(")", 1)
            fields = rest.split()  # after the command's name
            cmd = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError, ValueError):
            continue
        if fields[0] != "Z":
            out[int(stat.parent.name)] = Proc(int(fields[1]), int(fields[3]), cmd, name)
    return out
