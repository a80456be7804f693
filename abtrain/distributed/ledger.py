"""Every collective the run makes: payload, bytes on the wire, phase, node boundary.

Wire model (what each rank sends, for the algorithm gloo and NCCL use on a ring of the
group's ranks in rank order):
- all-reduce (ring): 2(n-1)/n · S to the next rank of the ring;
- broadcast (chain from the root): S to the next rank, except the chain's last rank;
- all-gather (ring): (n-1) · S to the next rank, S being one rank's share.
A send crosses a node boundary when the next rank lives on another node, so summing one
node's ranks gives the bytes leaving that node's network interface. abtrain's own
broadcasts to every rank go in two hops (`groups.Fanout`: one rank per node, then inside
each node), so one copy enters each other node under the chain and under gloo's binomial
tree alike; over a whole 2 x 2 world in one call, gloo's tree would cross twice.

What is kept is bounded by the run's length alone, never by buckets or ranks: each rank
adds its bytes into a small table per step (phase × operation × {intra, inter, calls});
at each checkpoint (a `flush`) the ranks sum their tables with one all-reduce, counted
like any other, and rank 0 appends the non-empty cells to `ledger.csv`. Per-collective
rows (`tracking.ledger_rows`, for short runs and tests) go to one file per rank, which
rank 0 concatenates into `ledger.jsonl` at the end, one file at a time.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from abtrain.files import append_lines, csv_step, cut_after

# Every phase label the trainer sets; the table's first axis.
PHASES = (
    "setup",
    "full",
    "warmup",
    "ab",
    "rebound",
    "local",
    "done",
    "sync",
    "factorize",
    "eval",
    "checkpoint",
)
OPS = ("all_reduce", "broadcast", "all_gather")
FIELDS = ("intra_bytes", "inter_bytes", "calls")
CSV_HEADER = "step,phase,op,calls,intra_bytes,inter_bytes"
STEP_TABLE_BYTES = len(PHASES) * len(OPS) * len(FIELDS) * 8  # int64 cells of one step


class CollectiveFailed(RuntimeError):
    """A collective that did not complete (a peer gone, a link cut, a timeout), named: the
    operation, its size, the phase and step, and the group's ranks on other nodes."""


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


def _cell() -> Tensor:
    return torch.zeros(len(PHASES), len(OPS), len(FIELDS), dtype=torch.int64)


class Ledger:
    """One rank's record of its collectives; the trainer sets `phase` and `step`."""

    def __init__(
        self,
        rank: int,
        nodes: list[int],
        run_dir: Path | None = None,
        keep_rows: bool = False,
        device: torch.device | None = None,
    ) -> None:
        self.rank, self.nodes, self.run_dir = rank, nodes, run_dir
        self.keep_rows, self.device = keep_rows, device or torch.device("cpu")
        self.phase = "setup"
        self.step = 0
        self.rows: list[dict[str, Any]] = []  # per-collective, since the last flush
        self.pending: dict[int, Tensor] = {}  # step -> this rank's table, since the last flush
        self.flushed = 0  # steps below this are in `world_totals` and ledger.csv
        self.world_totals = _cell()  # summed over every rank and flushed step
        # Running mean over ranks of the bytes sent, from this rank's view: each collective
        # counts what its whole group sends / group size (exact for the world, and for
        # groups that mirror each other, as A/B groups do). For live progress and metrics.
        self.sent = {"inter": 0.0, "intra": 0.0}
        self.sent_by_phase: dict[str, dict[str, float]] = {}  # the same, by phase
        self.comm_seconds = 0.0  # blocked in abtrain's own collectives
        self._launched = self._finished = 0.0  # last DDP bucket of the step

    @contextmanager
    def during(self, phase: str) -> Iterator[None]:
        """Count the collectives made inside under `phase` (a sync, an evaluation, a
        checkpoint); the phase before comes back after."""
        before, self.phase = self.phase, phase
        try:
            yield
        finally:
            self.phase = before

    def record(
        self, op: str, payload: int, group: dist.ProcessGroup | None, root: int | None = None
    ) -> None:
        ranks = group_ranks(group)
        sent, peer = wire_bytes(op, payload, ranks, self.rank, root)
        inter = self.nodes[peer] != self.nodes[self.rank]
        # A collective recorded after its step was flushed joins the next window.
        step = max(self.step, self.flushed)
        cell = self.pending.get(step)
        if cell is None:
            cell = self.pending[step] = _cell()
        p, o = PHASES.index(self.phase), OPS.index(op)
        cell[p, o, int(inter)] += sent
        cell[p, o, 2] += 1
        if self.keep_rows:
            self.rows.append(
                dict(
                    rank=self.rank,
                    step=step,
                    phase=self.phase,
                    op=op,
                    group=ranks,
                    root=root,
                    group_size=len(ranks),
                    group_nodes=len({self.nodes[r] for r in ranks}),
                    payload_bytes=payload,
                    wire_bytes=sent,
                    inter_node=inter,
                )
            )
        self._count(op, payload, ranks, root)

    def failed(self, op: str, payload: int, group: dist.ProcessGroup | None, err: Exception):
        """`err` (gloo's "Timed out waiting 20000ms for recv operation" names neither) as a
        CollectiveFailed naming the collective and the peers it was waiting on."""
        ranks = group_ranks(group)
        away = [r for r in ranks if self.nodes[r] != self.nodes[self.rank]]
        peers = ", ".join(f"rank {r} on node {self.nodes[r]}" for r in away) or "none"
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return CollectiveFailed(
            f"{op} of {payload} bytes over ranks {ranks} in the {self.phase} phase at step "
            f"{self.step} did not complete ({first}); its peers on other nodes: {peers}"
        )

    # Collectives made by abtrain itself go through these, so none escapes the ledger.
    def _call(self, name: str, tensor: Tensor, group, collective, **kw) -> None:
        t0 = time.perf_counter()
        try:
            collective(tensor, group=group, **kw)
        except RuntimeError as err:  # DistBackendError and gloo's own are RuntimeErrors
            raise self.failed(name, _nbytes(tensor), group, err) from err
        self.comm_seconds += time.perf_counter() - t0

    def all_reduce(
        self, tensor: Tensor, group: dist.ProcessGroup | None = None, op=dist.ReduceOp.SUM
    ) -> None:
        self.record("all_reduce", _nbytes(tensor), group)
        self._call("all_reduce", tensor, group, dist.all_reduce, op=op)

    def all_gather(self, tensor: Tensor, group: dist.ProcessGroup | None = None) -> list[Tensor]:
        """Every rank's `tensor`, in rank order (of the group)."""
        self.record("all_gather", _nbytes(tensor), group)
        out = [torch.empty_like(tensor) for _ in group_ranks(group)]
        self._call("all_gather", tensor, group, lambda t, **kw: dist.all_gather(out, t, **kw))
        return out

    def broadcast(self, tensor: Tensor, src: int, group: dist.ProcessGroup | None = None) -> None:
        self.record("broadcast", _nbytes(tensor), group, root=src)
        self._call("broadcast", tensor, group, dist.broadcast, src=src)

    def allreduce_hook(self, group: dist.ProcessGroup | None):
        """A DDP comm hook: averages each gradient bucket over `group`, recording it."""
        size = len(group_ranks(group))

        # No annotations: DDP inspects them, and postponed (string) ones fail its check.
        def hook(_state, bucket):
            buf = bucket.buffer()
            self.record("all_reduce", _nbytes(buf), group)
            buf.div_(size)
            self._launched = time.perf_counter()
            fut = dist.all_reduce(buf, group=group, async_op=True).get_future()
            return fut.then(lambda f: self._done(f, _nbytes(buf), group))

        return hook

    def _done(self, fut, payload: int, group: dist.ProcessGroup | None):
        self._finished = time.perf_counter()
        try:
            return fut.value()[0]
        except RuntimeError as err:  # surfaces in the backward pass, named
            raise self.failed("all_reduce", payload, group, err) from err

    def exposed_allreduce_seconds(self) -> float:
        """Since the last call: how long the last gradient bucket's all-reduce outlasted
        its launch, which comes when the backward pass has computed the last gradient, so
        this is the communication the step waited for rather than overlapped."""
        wait = max(0.0, self._finished - self._launched)
        self._launched = self._finished = 0.0
        return wait

    def counting_dist(self) -> _CountingDist:
        return _CountingDist(self)

    # ---------------------------------------------------------------- combining ranks
    def flush(self) -> None:
        """Every rank, together: sum the tables of the steps since the last flush over the
        world (one all-reduce, itself recorded) and append them to the run's files."""
        n = self.step + 1 - self.flushed
        if n <= 0:
            return
        self.record("all_reduce", n * STEP_TABLE_BYTES, None)
        table = torch.zeros(n, *_cell().shape, dtype=torch.int64)
        for step, cell in self.pending.items():
            table[step - self.flushed] += cell
        table = table.to(self.device)
        dist.all_reduce(table)
        table = table.cpu()
        self.world_totals += table.sum(0)
        if self.run_dir is not None:
            if self.rank == 0:
                append_lines(
                    self.run_dir / "ledger.csv", _csv_lines(table, self.flushed), CSV_HEADER
                )
            if self.keep_rows:
                append_lines(self._rows_path(self.rank), [json.dumps(r) for r in self.rows])
        self.pending, self.rows, self.flushed = {}, [], self.step + 1

    def concat_rows(self, world: int) -> Path:
        """Rank 0, after every rank's last flush: the per-rank rows as one ledger.jsonl."""
        out = self.run_dir / "ledger.jsonl"
        if not (self.run_dir / "ledger").exists():
            return out  # joined by an earlier run of the same, finished, folder
        tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
        with open(tmp, "wb") as dst:
            for r in range(world):
                part = self._rows_path(r)
                if part.exists():
                    with open(part, "rb") as src:
                        while chunk := src.read(1 << 20):
                            dst.write(chunk)
            dst.flush()
            os.fsync(dst.fileno())
        os.replace(tmp, out)
        shutil.rmtree(self.run_dir / "ledger")  # now a second copy
        return out

    def _rows_path(self, rank: int) -> Path:
        return self.run_dir / "ledger" / f"rank_{rank}.jsonl"

    # ---------------------------------------------------------------- results
    def totals(self, world_size: int) -> dict[str, Any]:
        """Bytes per rank (mean over ranks): total, inter-node, intra-node, and by phase.
        Exact once every rank has flushed; phases that made no collective are left out."""
        by_phase = {}
        for p, name in enumerate(PHASES):
            cell = self.world_totals[p]
            if cell[:, 2].sum() == 0:
                continue
            intra, inter = (cell[:, i].sum().item() / world_size for i in range(2))
            by_phase[name] = dict(total=intra + inter, inter=inter, intra=intra)
        by_phase = dict(sorted(by_phase.items()))
        return dict(
            total_bytes=sum(d["total"] for d in by_phase.values()),
            inter_node_bytes=sum(d["inter"] for d in by_phase.values()),
            intra_node_bytes=sum(d["intra"] for d in by_phase.values()),
            by_phase=by_phase,
        )

    # ---------------------------------------------------------------- checkpoints
    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: a constant size, taken right after a flush."""
        return dict(
            flushed=self.flushed,
            world_totals=self.world_totals.clone(),
            sent=dict(self.sent),
            sent_by_phase={k: dict(v) for k, v in self.sent_by_phase.items()},
            comm_seconds=self.comm_seconds,
        )

    def load_state(self, state: dict[str, Any]) -> None:
        """Resume: drop from the run's files what was appended after that checkpoint."""
        self.flushed, self.world_totals = state["flushed"], state["world_totals"].clone()
        self.sent, self.comm_seconds = dict(state["sent"]), state["comm_seconds"]
        # (not kept by checkpoints from before it was)
        self.sent_by_phase = {k: dict(v) for k, v in state.get("sent_by_phase", {}).items()}
        self.pending, self.rows = {}, []
        if self.run_dir is None:
            return
        if self.rank == 0:
            cut_after(self.run_dir / "ledger.csv", self.flushed, csv_step, header=True)
        if self.keep_rows:
            cut_after(self._rows_path(self.rank), self.flushed, _jsonl_step, header=False)

    def _count(self, op: str, payload: int, ranks: list[int], root: int | None) -> None:
        phase = self.sent_by_phase.setdefault(self.phase, {"inter": 0.0, "intra": 0.0})
        for member in ranks:
            sent, peer = wire_bytes(op, payload, ranks, member, root)
            side = "inter" if self.nodes[peer] != self.nodes[member] else "intra"
            self.sent[side] += sent / len(ranks)
            phase[side] += sent / len(ranks)

    def view(self) -> dict[str, Any]:
        """`totals`' figures as this rank sees them (`sent`), with no collective: exact
        for collectives over the world and for groups that mirror each other."""
        by_phase = {
            name: dict(total=d["inter"] + d["intra"], inter=d["inter"], intra=d["intra"])
            for name, d in sorted(self.sent_by_phase.items())
        }
        return dict(
            total_bytes=self.sent["inter"] + self.sent["intra"],
            inter_node_bytes=self.sent["inter"],
            intra_node_bytes=self.sent["intra"],
            by_phase=by_phase,
        )


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


def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


def _csv_lines(table: Tensor, first_step: int) -> list[str]:
    lines = []
    for i, p, o in table[:, :, :, 2].nonzero().tolist():
        intra, inter, calls = table[i, p, o].tolist()
        lines.append(f"{first_step + i},{PHASES[p]},{OPS[o]},{calls},{intra},{inter}")
    return lines


def _jsonl_step(line: str) -> int | None:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None


def read_csv(path: Path) -> list[dict[str, Any]]:
    """ledger.csv as rows (bytes summed over every rank)."""
    rows = []
    for line in Path(path).read_text().splitlines()[1:]:
        step, phase, op, calls, intra, inter = line.split(",")
        rows.append(
            dict(
                step=int(step),
                phase=phase,
                op=op,
                calls=int(calls),
                intra_bytes=int(intra),
                inter_bytes=int(inter),
            )
        )
    return rows
