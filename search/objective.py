"""One objective for every backend: train the config's model with the engine on this
worker's ranks and yield the validation error (100 − top-1, in %) after each evaluation.

A worker is `ranks_per_worker` MPI ranks; they form one torch.distributed group (gloo on
CPU, NCCL on GPUs), made once per worker over an OS-chosen port broadcast on the MPI
sub-communicator (a fixed port per worker fails on the second individual: address in use),
and made again only after a failure.
"""

from __future__ import annotations

import shutil
import socket
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from abtrain import config as abconfig
from abtrain.commands.localrun import cores_each
from abtrain.distributed.process import Launch
from abtrain.method import methods
from abtrain.run.trainer import Trainer, TrainingDiverged


@dataclass
class Outcome:
    error: float  # what the backend minimises: the last evaluation's error, or the penalty
    status: str  # ok | pruned | diverged | crashed | invalid
    errors: list[float] = field(default_factory=list)  # after each evaluation
    message: str = ""
    # a run that finished: its inter-node bytes per rank (the ledger's), its compression
    # (parameters of the full model over those it ended with) and kept share of the rank
    inter_node_bytes: float | None = None
    compression: float | None = None
    kept_rank: float | None = None


def launch_for(comm: Any, nodes: int = 1) -> Launch:
    """This rank's place in its worker: nodes told apart by host name, or, for `nodes` > 1
    on one host, consecutive ranks standing for each node (as `abtrain.launch --nnodes`
    emulates them), so that the ledger counts what would cross a node boundary."""
    hosts = comm.allgather(socket.gethostname())
    if nodes > 1 and len(set(hosts)) == 1:
        per = comm.size // nodes
        return Launch(
            rank=comm.rank,
            world_size=comm.size,
            local_rank=comm.rank % per,
            ranks_per_node=per,
            node=comm.rank // per,
        )
    names = list(dict.fromkeys(hosts))
    mine = hosts[comm.rank]
    return Launch(
        rank=comm.rank,
        world_size=comm.size,
        local_rank=[h for h in hosts[: comm.rank]].count(mine),
        ranks_per_node=hosts.count(mine),
        node=names.index(mine),
    )


def ensure_group(comm: Any, backend: str, timeout_s: int) -> None:
    """The worker's torch process group, over an OS-chosen port (made once, reused)."""
    if dist.is_initialized():
        return
    launch = launch_for(comm)
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(launch.local_rank % torch.cuda.device_count())
    host = comm.bcast(socket.gethostname() if comm.rank == 0 else None, root=0)
    if comm.size > 1 and len(set(comm.allgather(host))) == 1 and host == socket.gethostname():
        host = "127.0.0.1"  # one machine: loopback, whatever the host name resolves to
    timeout = timedelta(seconds=timeout_s)
    if comm.rank == 0:
        store = dist.TCPStore(
            host, 0, comm.size, is_master=True, wait_for_workers=False, timeout=timeout
        )
        comm.bcast(store.port, root=0)
    else:
        port = comm.bcast(None, root=0)
        store = dist.TCPStore(host, port, comm.size, is_master=False, timeout=timeout)
    dist.init_process_group(
        backend, store=store, rank=comm.rank, world_size=comm.size, timeout=timeout
    )


def evaluate(
    train_raw: dict[str, Any],
    run_overrides: list[str],
    comm: Any,
    out: Path,
    penalty: float,
    stop: Callable[[int, float], bool],
    nodes: int = 1,
) -> Outcome:
    """Train one individual on this worker's ranks; every rank returns the same Outcome.

    `stop(i, error)` is asked on the worker's root after evaluation i; True prunes the run.
    """
    errors: list[float] = []
    try:
        cfg = abconfig.from_dict(train_raw, run_overrides)
        launch = launch_for(comm, nodes)
        methods.check_world(cfg, comm.size, launch.ranks_per_node)
    except abconfig.ConfigError as err:
        return Outcome(penalty, "invalid", message=str(err))
    status, message = "ok", ""
    try:
        ensure_group(comm, cfg.dist.backend, cfg.dist.timeout_s)
        if comm.rank == 0:
            shutil.rmtree(out, ignore_errors=True)  # an individual that was cut off
        comm.Barrier()
        trainer = Trainer(cfg, out, launch)
        runs = trainer.evaluations()
        for i, result in enumerate(runs):
            errors.append(100.0 - result["val_top1"])
            pruned = comm.bcast(stop(i, errors[-1]) if comm.rank == 0 else None, root=0)
            if pruned:
                runs.close()
                status = "pruned"
                break
    except TrainingDiverged as err:
        status, message = "diverged", str(err)
    except Exception as err:  # one bad individual must not end the search
        status, message = "crashed", f"{type(err).__name__}: {err}"
        traceback.print_exc()
    # Agree on the outcome: a rank that crashed alone makes the others' collectives fail
    # (closed connection or timeout), so all of them get here.
    worst = comm.allreduce(["ok", "pruned", "diverged", "crashed"].index(status), op=_max())
    agreed = ["ok", "pruned", "diverged", "crashed"][worst]
    if agreed == "crashed" and dist.is_initialized():
        dist.destroy_process_group()  # a broken group: the next individual makes a new one
    if agreed in ("diverged", "crashed") or not errors:
        return Outcome(penalty, agreed, errors, message or f"a peer rank {agreed}")
    if agreed == "pruned":
        return Outcome(errors[-1], agreed, errors, message)
    measured = comm.bcast(_measured(trainer) if comm.rank == 0 else None, root=0)
    return Outcome(errors[-1], agreed, errors, message, **measured)


def _measured(trainer: Trainer) -> dict[str, float]:
    """A finished run's bytes, compression and kept rank share (1.0 for a method that
    factorises nothing), from its summary (rank 0's)."""
    from abtrain.run import results

    s = trainer.summary
    ranks = s.get("ranks") or {}
    return dict(
        inter_node_bytes=float(s["traffic"]["inter_node_bytes"]),
        compression=float(s["compression_ratio"]),
        kept_rank=results.mean_rank_fraction(ranks, trainer.ab.layers) if ranks else 1.0,
    )


def _max():
    from mpi4py import MPI

    return MPI.MAX


def local_threads(comm: Any) -> None:
    """Share the node's cores among the ranks on it."""
    local = comm.Split_type(_shared()).size
    torch.set_num_threads(cores_each(local))


def _shared():
    from mpi4py import MPI

    return MPI.COMM_TYPE_SHARED
