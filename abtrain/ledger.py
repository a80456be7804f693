"""Every collective the run makes: payload, bytes on the wire, phase, node boundary.

Wire model (what each rank sends, for the algorithm gloo and NCCL use on a ring of the
group's ranks in rank order):
- all-reduce (ring): 2(n-1)/n · S to the next rank of the ring;
- broadcast (chain from the root): S to the next rank, except the chain's last rank;
- all-gather (ring): (n-1) · S to the next rank, S being one rank's share.
A send crosses a node boundary when the next rank lives on another node, so summing one
node's ranks gives the bytes leaving that node's network interface.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch import Tensor

from abtrain.checkpoint import atomic_write_text


def group_ranks(group: dist.ProcessGroup | None) -> list[int]:
    return sorted(dist.get_process_group_ranks(group or dist.group.WORLD))


def wire_bytes(
    op: str, payload: int, ranks: list[int], rank: int, root: int | None
) -> tuple[int, int]:
    """(bytes this rank sends, the rank it sends them to) under the ring/chain model."""
    n = len(ranks)
    if n == 1 or op == "barrier":
        return 0, rank
    pos = ranks.index(rank)
    succ = ranks[(pos + 1) % n]
    if op == "all_reduce":
        return round(2 * (n - 1) / n * payload), succ
    if op == "all_gather":
        return (n - 1) * payload, succ
    if op == "broadcast":
        tail = ranks[(ranks.index(root) - 1) % n]
        return (0 if rank == tail else payload), succ
    raise ValueError(f"unknown collective {op!r}")


class Ledger:
    """One rank's record of its collectives; the trainer sets `phase` and `step`."""

    def __init__(self, rank: int, nodes: list[int]) -> None:
        self.rank = rank
        self.nodes = nodes
        self.phase = "setup"
        self.step = 0
        self.rows: list[dict[str, Any]] = []
        # Running mean over ranks of the bytes sent, from this rank's view: each collective
        # counts what its whole group sends / group size (exact for the world, and for
        # groups that mirror each other, as A/B groups do). For live progress and metrics.
        self.sent = {"inter": 0.0, "intra": 0.0}

    def record(
        self, op: str, payload: int, group: dist.ProcessGroup | None, root: int | None = None
    ) -> None:
        ranks = group_ranks(group)
        sent, peer = wire_bytes(op, payload, ranks, self.rank, root)
        self.rows.append(
            dict(
                rank=self.rank,
                step=self.step,
                phase=self.phase,
                op=op,
                group=ranks,
                root=root,
                group_size=len(ranks),
                group_nodes=len({self.nodes[r] for r in ranks}),
                payload_bytes=payload,
                wire_bytes=sent,
                inter_node=self.nodes[peer] != self.nodes[self.rank],
            )
        )
        self._count(op, payload, ranks, root)

    # Collectives made by abtrain itself go through these, so none escapes the ledger.
    def all_reduce(
        self, tensor: Tensor, group: dist.ProcessGroup | None = None, op=dist.ReduceOp.SUM
    ) -> None:
        self.record("all_reduce", _nbytes(tensor), group)
        dist.all_reduce(tensor, op=op, group=group)

    def broadcast(self, tensor: Tensor, src: int, group: dist.ProcessGroup | None = None) -> None:
        self.record("broadcast", _nbytes(tensor), group, root=src)
        dist.broadcast(tensor, src=src, group=group)

    def allreduce_hook(self, group: dist.ProcessGroup | None):
        """A DDP comm hook: averages each gradient bucket over `group`, recording it."""
        size = len(group_ranks(group))

        # No annotations: DDP inspects them, and postponed (string) ones fail its check.
        def hook(_state, bucket):
            buf = bucket.buffer()
            self.record("all_reduce", _nbytes(buf), group)
            buf.div_(size)
            fut = dist.all_reduce(buf, group=group, async_op=True).get_future()
            return fut.then(lambda f: f.value()[0])

        return hook

    def counting_dist(self) -> _CountingDist:
        return _CountingDist(self)

    def state(self) -> list[dict[str, Any]]:
        return list(self.rows)

    def load_state(self, rows: list[dict[str, Any]]) -> None:
        self.rows = list(rows)
        self.sent = {"inter": 0.0, "intra": 0.0}
        for r in self.rows:
            self._count(r["op"], r["payload_bytes"], r["group"], r.get("root"))

    def _count(self, op: str, payload: int, ranks: list[int], root: int | None) -> None:
        for member in ranks:
            sent, peer = wire_bytes(op, payload, ranks, member, root)
            side = "inter" if self.nodes[peer] != self.nodes[member] else "intra"
            self.sent[side] += sent / len(ranks)


class _CountingDist:
    """Stands in for `torch.distributed` inside torch's PowerSGD hook module.

    PowerSGD issues its all-reduces from future callbacks, outside any hook we could wrap,
    so we count them where they are made rather than re-deriving its message sizes.
    """

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger

    def __getattr__(self, name: str) -> Any:
        return getattr(dist, name)

    def all_reduce(self, tensor: Tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        self._ledger.record("all_reduce", _nbytes(tensor), group)
        return dist.all_reduce(tensor, op=op, group=group, async_op=async_op)


def write(path: Path, rows: list[dict[str, Any]]) -> None:
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))


def read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line]


def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


def totals(rows: list[dict[str, Any]], world_size: int) -> dict[str, Any]:
    """Bytes per rank (mean over ranks): total, inter-node, intra-node, and by phase."""
    by_phase: dict[str, dict[str, float]] = defaultdict(lambda: dict(total=0, inter=0, intra=0))
    for r in rows:
        side = "inter" if r["inter_node"] else "intra"
        by_phase[r["phase"]]["total"] += r["wire_bytes"]
        by_phase[r["phase"]][side] += r["wire_bytes"]
    by_phase = {p: {k: v / world_size for k, v in d.items()} for p, d in sorted(by_phase.items())}
    return dict(
        total_bytes=sum(d["total"] for d in by_phase.values()),
        inter_node_bytes=sum(d["inter"] for d in by_phase.values()),
        intra_node_bytes=sum(d["intra"] for d in by_phase.values()),
        by_phase=by_phase,
    )
