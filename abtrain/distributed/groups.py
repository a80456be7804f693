"""Node identity from the launcher, and the A/B worker groups.

Ranks form groups of `group_size` consecutive ranks (by default one node, so a group's
traffic stays inside a node). The first half of the groups train A, the rest B; with an
odd count the extra group trains B.

A broadcast to every rank goes in two hops (`Fanout`): across nodes among one rank per
node, then inside each node. So one copy enters each other node whatever the backend's
algorithm, as the ledger counts it: over the whole world, gloo's binomial tree would send
two copies across nodes on 2 nodes x 2 ranks (0->2 and 1->3) where the ledger counts one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch comes with the first group made: roles() is read without it
    import torch.distributed as dist


def node_id_from_env() -> int:
    """This process's node: torchrun's node rank, else SLURM's node id, else 0."""
    for var in ("GROUP_RANK", "SLURM_NODEID"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def roles(
    world_size: int, group_size: int, all_train_b: bool = False
) -> list[tuple[list[int], str]]:
    """[(ranks, 'a' | 'b')] for each group, in rank order. `all_train_b`: every group
    trains B ("no groups" is one group of the world; the authors' VGG16 config, groups of
    one node whose B factors are averaged at the sync)."""
    count = world_size // group_size
    return [
        (
            list(range(g * group_size, (g + 1) * group_size)),
            "b" if all_train_b or g >= count // 2 else "a",
        )
        for g in range(count)
    ]


class ProcessGroups:
    """One process group per set of ranks, made on first use. The groups a run needs often
    coincide (a node's ranks are its A/B group and a broadcast's second hop; A's learners
    are the A groups), and on NCCL each group is a communicator with its own buffers on
    every GPU in it. Every rank must ask for the same rank sets in the same order."""

    def __init__(self) -> None:
        self._made: dict[tuple[int, ...], dist.ProcessGroup] = {}

    def get(self, ranks: list[int]) -> dist.ProcessGroup:
        import torch.distributed as dist

        key = tuple(sorted(ranks))
        if key not in self._made:
            self._made[key] = dist.new_group(list(key))  # collective over the world
        return self._made[key]

    def __len__(self) -> int:
        return len(self._made)


@dataclass
class Fanout:
    """One rank's part in a two-hop broadcast from `root`."""

    root: int
    across: dist.ProcessGroup | None  # root + the first rank of every other node (members)
    within: dist.ProcessGroup | None  # this rank's node, if it has more than one rank
    local_root: int  # where this node's copy comes from: the root, or this node's first rank


def fanout(rank: int, nodes: list[int], root: int, pgs: ProcessGroups) -> Fanout:
    """A broadcast's process groups; every rank must call this with the same args."""
    members: dict[int, list[int]] = {}
    for r, node in enumerate(nodes):
        members.setdefault(node, []).append(r)
    heads = {node: root if root in ranks else ranks[0] for node, ranks in members.items()}
    across = pgs.get(list(heads.values())) if len(heads) > 1 else None
    within = None
    for node, ranks in members.items():
        pg = pgs.get(ranks) if len(ranks) > 1 else None  # every rank asks for every node's
        if node == nodes[rank]:
            within = pg
    head = heads[nodes[rank]]
    return Fanout(root, across if rank == head else None, within, head)


@dataclass
class ABGroups:
    """This rank's view of the groups, with the process groups it needs."""

    roles: list[tuple[list[int], str]]
    role: str  # the factor this rank trains: 'a' or 'b'
    group: dist.ProcessGroup  # this rank's group (DDP during the AB phase)
    a_ranks: list[int]
    b_ranks: list[int]
    learners: dist.ProcessGroup | None  # ranks sharing this rank's role (only_learned)
    share_a: Fanout | None = None  # A and B from their learners to every rank (only_learned)
    share_b: Fanout | None = None

    @property
    def single(self) -> bool:
        return len(self.roles) == 1


def build(
    rank: int,
    groups: list[tuple[list[int], str]],
    with_learners: bool,
    nodes: list[int],
    pgs: ProcessGroups | None = None,
) -> ABGroups:
    """The groups' process groups; every rank must call this with the same roles and node
    map (`nodes[r]`: rank r's node)."""
    pgs = pgs if pgs is not None else ProcessGroups()
    mine = None
    for ranks, role in groups:
        pg = pgs.get(ranks)  # every rank asks for every group
        if rank in ranks:
            mine, my_role = pg, role
    a_ranks = [r for ranks, role in groups for r in ranks if role == "a"]
    b_ranks = [r for ranks, role in groups for r in ranks if role == "b"]
    learners = share_a = share_b = None
    if with_learners:
        for role, ranks in (("a", a_ranks), ("b", b_ranks)):
            pg = pgs.get(ranks) if ranks else None
            if role == my_role:
                learners = pg
        share_a, share_b = (
            fanout(rank, nodes, ranks[0], pgs) if ranks else None for ranks in (a_ranks, b_ranks)
        )
    return ABGroups(groups, my_role, mine, a_ranks, b_ranks, learners, share_a, share_b)
