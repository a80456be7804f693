"""Node identity from the launcher, and the A/B worker groups.

Ranks form groups of `group_size` consecutive ranks (by default one node, so a group's
traffic stays inside a node). The first half of the groups train A, the rest B; with an
odd count the extra group trains B.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch.distributed as dist


def node_id_from_env() -> int:
    """This process's node: torchrun's node rank, else SLURM's node id, else 0."""
    for var in ("GROUP_RANK", "SLURM_NODEID"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def plan(
    world_size: int, group_size: int, all_train_b: bool = False
) -> list[tuple[list[int], str]]:
    """[(ranks, 'a' | 'b')] for each group, in rank order."""
    if all_train_b:
        return [(list(range(world_size)), "b")]
    count = world_size // group_size
    return [
        (list(range(g * group_size, (g + 1) * group_size)), "a" if g < count // 2 else "b")
        for g in range(count)
    ]


@dataclass
class ABGroups:
    """This rank's view of the groups, with the process groups it needs."""

    plan: list[tuple[list[int], str]]
    role: str  # the factor this rank trains: 'a' or 'b'
    group: dist.ProcessGroup  # this rank's group (DDP during the AB phase)
    a_ranks: list[int]
    b_ranks: list[int]
    learners: dist.ProcessGroup | None  # ranks sharing this rank's role (only_learned)

    @property
    def single(self) -> bool:
        return len(self.plan) == 1


def build(rank: int, groups: list[tuple[list[int], str]], with_learners: bool) -> ABGroups:
    """Create the process groups; every rank must call this with the same plan."""
    mine = None
    for ranks, role in groups:
        pg = dist.new_group(ranks)  # collective: every rank creates every group
        if rank in ranks:
            mine, my_role = pg, role
    a_ranks = [r for ranks, role in groups for r in ranks if role == "a"]
    b_ranks = [r for ranks, role in groups for r in ranks if role == "b"]
    learners = None
    if with_learners:
        for role, ranks in (("a", a_ranks), ("b", b_ranks)):
            pg = dist.new_group(ranks) if ranks else None
            if role == my_role:
                learners = pg
    return ABGroups(groups, my_role, mine, a_ranks, b_ranks, learners)
