import pytest
import torch
from torch import nn

from abtrain.distributed import groups
from abtrain.distributed.ledger import Ledger
from abtrain.method import lowrank, sync
from tests.helpers import spawn

pytestmark = pytest.mark.multiprocess  # every test spawns gloo ranks


def _sync(rank, world, mode):
    model = nn.Sequential(nn.Linear(3, 2))
    layers = lowrank.convert(model, [])
    roles = groups.roles(world, 2)
    pgs = groups.ProcessGroups()
    g = groups.build(rank, roles, mode == "only_learned", [0, 0, 1, 1], pgs)
    layer = layers["0"]
    # Every rank holds different A, B and bias, as after an AB phase.
    layer.set_factors(torch.full((2, 1), rank + 1.0), torch.full((1, 3), 10.0 * (rank + 1)), g.role)
    with torch.no_grad():
        layer.bias.fill_(float(rank))
    ledger = Ledger(rank, [0, 0, 1, 1], keep_rows=True)
    sync.average(model, layers, g, mode, ledger)
    a, b, bias = layer.a[0, 0].item(), layer.b[0, 0].item(), layer.bias[0].item()
    sync.merge(layers)
    return (
        g.role,
        a,
        b,
        bias,
        layer.weight[0, 0].item(),
        [(r["op"], r["payload_bytes"], r["group_size"]) for r in ledger.rows],
        len(pgs),
    )


def test_with_stale_averages_trained_and_frozen_factors_over_the_world():
    results = spawn(_sync, args=("with_stale",))
    for _role, a, b, bias, w, rows, _made in results:
        assert (a, b, bias) == pytest.approx((2.5, 25.0, 1.5))  # means of 1..4, 10..40, 0..3
        assert w == pytest.approx(2.5 * 25.0)  # W = A·B after the merge
        assert rows == [("all_reduce", 4 * (2 + 3 + 2), 4)]  # A, B, bias in one all-reduce
    assert [r[0] for r in results] == ["a", "a", "b", "b"]


def test_only_learned_averages_each_factor_over_its_learners_then_shares_it():
    results = spawn(_sync, args=("only_learned",))
    for rank, (role, a, b, bias, _w, rows, made) in enumerate(results):
        assert (a, b, bias) == pytest.approx((1.5, 35.0, 1.5))  # A from ranks 0-1, B from 2-3
        learned = 4 * 2 if role == "a" else 4 * 3
        # Each factor goes once from node to node, between ranks 0 and 2 (A's root and B's
        # root head their nodes), then inside each node: never over the world in one go.
        head = rank in (0, 2)
        a_rows = [("broadcast", 8, 2)] * (2 if head else 1)
        b_rows = [("broadcast", 12, 2)] * (2 if head else 1)
        assert rows == [("all_reduce", learned, 2), *a_rows, *b_rows, ("all_reduce", 8, 4)]
        # the two node groups serve as A/B groups, learners and second hops; plus {0, 2}
        assert made == 3


def _fan_out(rank, world, root):
    nodes = [r // 3 for r in range(world)]
    route = groups.fanout(rank, nodes, root, groups.ProcessGroups())
    ledger = Ledger(rank, nodes, keep_rows=True)
    t = torch.full((5,), float(rank))
    sync.share([t], ledger, route)
    inter = sum(r["wire_bytes"] for r in ledger.rows if r["inter_node"])  # this rank sent
    return t.tolist(), inter, [r["group_size"] for r in ledger.rows]


def test_a_broadcast_enters_each_other_node_once_even_from_a_rank_that_heads_no_node():
    """Root 4 is the second rank of node 1: it sends to node 0's first rank, which passes it
    on inside node 0, while root 4 passes it to the rest of node 1 itself."""
    results = spawn(_fan_out, world=6, ranks_per_node=3, args=(4,))
    for rank, (values, _inter, sizes) in enumerate(results):
        assert values == [4.0] * 5
        assert sizes == ([2, 3] if rank in (0, 4) else [3])  # across the nodes, then inside
    assert [inter for _, inter, _ in results] == [0, 0, 0, 0, 5 * 4, 0]  # one copy, 4 to 0


def _rank0(rank, world):
    model = nn.Sequential(nn.Linear(3, 2))  # W is 2 x 3, wide: A is 3 x k, B is k x 2
    layers = lowrank.convert(model, [])
    g = groups.build(rank, groups.roles(world, 2, all_train_b=True), False, [0, 0, 1, 1])
    layer = layers["0"]
    layer.set_factors(torch.full((3, 1), rank + 1.0), torch.full((1, 2), 10.0 * (rank + 1)), "b")
    with torch.no_grad():
        layer.bias.fill_(float(rank))
    ledger = Ledger(rank, [0, 0, 1, 1], keep_rows=True)
    route = groups.fanout(rank, [0, 0, 1, 1], 0, groups.ProcessGroups())
    sync.take_rank0(model, layers, ledger, route)
    rows = [(r["op"], r["payload_bytes"], r["group_size"]) for r in ledger.rows]
    return g.role, layer.weight.detach().tolist(), layer.bias.tolist(), rows


def test_rank0_sync_gives_every_rank_rank_0s_w_as_the_authors_c3dbc10_did():
    """Two half-world groups train B; nothing is averaged; rank 0's W = (A·B)ᵀ and its
    bias reach every rank in one two-hop broadcast (W and bias: 8 floats), factors not sent."""
    for rank, (role, w, bias, rows) in enumerate(spawn(_rank0)):
        assert role == "b"
        assert w == [[10.0] * 3] * 2 and bias == [0.0, 0.0]  # rank 0's: A·B = 1 x 10
        hop = [("broadcast", 4 * 8, 2)]
        assert rows == (hop * 2 if rank in (0, 2) else hop)  # across the nodes, then inside
