"""This process in the run: where the launcher put it, its device and process group, a
clock that waits for the device, and what may ask it to stop (SIGUSR1, a deadline, the
tests' injected failure)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from abtrain.config import Config
from abtrain.distributed import groups


@dataclass(frozen=True)
class Launch:
    """Where this process stands, as the launcher (torchrun, SLURM) told it."""

    rank: int
    world_size: int
    local_rank: int
    ranks_per_node: int
    node: int

    @classmethod
    def from_env(cls) -> Launch:
        world = int(os.environ.get("WORLD_SIZE", 1))
        return cls(
            rank=int(os.environ.get("RANK", 0)),
            world_size=world,
            local_rank=int(os.environ.get("LOCAL_RANK", 0)),
            ranks_per_node=int(os.environ.get("LOCAL_WORLD_SIZE", world)),
            node=groups.node_id_from_env(),
        )


def start(cfg: Config, launch: Launch) -> tuple[str, torch.device]:
    """Join the process group (unless the caller has: a search shares its own); returns the
    backend and this rank's device."""
    backend = cfg.dist.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", launch.local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        # `python -m abtrain train` started alone, not by torchrun: a world of one, whose
        # store needs no address (env:// would stop on MASTER_ADDR in a traceback)
        alone = launch.world_size == 1 and "MASTER_ADDR" not in os.environ
        dist.init_process_group(
            backend,
            store=dist.HashStore() if alone else None,
            rank=launch.rank,
            world_size=launch.world_size,
            timeout=timedelta(seconds=cfg.dist.timeout_s),
        )
    return backend, device


def node_map(node: int, device: torch.device) -> list[int]:
    """Every rank's node (this one's is `node`); the one collective before the ledger."""
    mine = torch.tensor([node], device=device)
    nodes = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(nodes, mine)
    return [int(n) for n in nodes]


def clock(device: torch.device) -> float:
    """A clock for the rare, long pieces (syncs, SVDs, evaluations): waits for the device
    first, so their time is not charged to the next step."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


class StopRequests:
    """SIGUSR1 (a batch system's warning before its time limit) or the ABTRAIN_DEADLINE a
    batch job sets: noted here, acted on at the next checkpoint by all ranks together."""

    def __init__(self) -> None:
        self.signalled = False
        self._usr1 = None  # the disposition borrowed, given back by `restore`
        if threading.current_thread() is threading.main_thread():
            self._usr1 = signal.signal(signal.SIGUSR1, self.on_signal)

    def on_signal(self, *_: object) -> None:
        self.signalled = True

    def requested(self) -> bool:
        deadline = os.environ.get("ABTRAIN_DEADLINE", "")
        return self.signalled or (deadline.isdigit() and time.time() > int(deadline))

    def restore(self) -> None:
        if self._usr1 is not None:
            # Left in place, Python's shutdown would reset our handler to the default
            # action, and a SIGUSR1 arriving then (SLURM's, just as the run stopped at
            # its deadline) would kill a rank that had stopped cleanly; under SLURM the
            # disposition given back is the launcher's "ignore".
            signal.signal(signal.SIGUSR1, self._usr1)


def fail_if_asked(rank: int, step: int, resumed: bool) -> None:
    """Fault injection for tests: ABTRAIN_FAIL_AT=rank:step kills that rank there, in a
    run that started afresh on torchrun's first attempt only: a failure that came back
    after every restart would only use up `--max-restarts`. (Under the c10d rendezvous a
    node whose ranks restart because another one failed keeps its count at 0, and node
    ranks are dealt anew, so the count alone can't tell; a resumed run can.)"""
    spec = os.environ.get("ABTRAIN_FAIL_AT", "")
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    if spec and first_attempt and not resumed and spec == f"{rank}:{step}":
        print(
            f"[abtrain] rank {rank}: injected failure at step {step}", file=sys.stderr, flush=True
        )
        os._exit(13)
