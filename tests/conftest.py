"""Shared helpers: a test config from params.yaml, and real multi-process runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch.multiprocessing as mp

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
    import torch.distributed as dist

    os.environ["GROUP_RANK"] = str(nodes[rank])
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        queue.put((rank, fn(rank, world, *args)))
    except BaseException as err:  # report, so the parent doesn't wait forever
        queue.put((rank, err))
        raise
    finally:
        dist.destroy_process_group()


def spawn(fn, world: int = 4, ranks_per_node: int = 2, args: tuple = ()) -> list:
    """Run fn(rank, world, *args) on `world` real gloo ranks; returns each rank's result."""
    nodes = [r // ranks_per_node for r in range(world)]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as d:
        procs = [
            ctx.Process(target=_worker, args=(r, world, nodes, f"{d}/init", fn, args, queue))
            for r in range(world)
        ]
        for p in procs:
            p.start()
        results = dict(queue.get(timeout=120) for _ in procs)
        for p in procs:
            p.join(timeout=60)
    for r, res in results.items():
        if isinstance(res, BaseException):
            raise AssertionError(f"rank {r} failed: {res!r}")
    return [results[r] for r in range(world)]


@pytest.fixture
def tiny():
    return tiny_config
