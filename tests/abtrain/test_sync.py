import pytest
import torch
from torch import nn

from abtrain import groups, lowrank, sync
from abtrain.ledger import Ledger
from tests.conftest import spawn


def _sync(rank, world, mode):
    model = nn.Sequential(nn.Linear(3, 2))
    layers = lowrank.convert(model, [])
    plan = groups.plan(world, 2)
    g = groups.build(rank, plan, with_learners=mode == "only_learned")
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
    )


def test_with_stale_averages_trained_and_frozen_factors_over_the_world():
    results = spawn(_sync, args=("with_stale",))
    for _role, a, b, bias, w, rows in results:
        assert (a, b, bias) == pytest.approx((2.5, 25.0, 1.5))  # means of 1..4, 10..40, 0..3
        assert w == pytest.approx(2.5 * 25.0)  # W = A·B after the merge
        assert rows == [("all_reduce", 4 * (2 + 3 + 2), 4)]  # A, B, bias in one all-reduce
    assert [r[0] for r in results] == ["a", "a", "b", "b"]


def test_only_learned_averages_each_factor_over_its_learners_then_shares_it():
    results = spawn(_sync, args=("only_learned",))
    for role, a, b, bias, _w, rows in results:
        assert (a, b, bias) == pytest.approx((1.5, 35.0, 1.5))  # A from ranks 0-1, B from 2-3
        learned = 4 * 2 if role == "a" else 4 * 3
        assert rows == [
            ("all_reduce", learned, 2),
            ("broadcast", 8, 4),
            ("broadcast", 12, 4),
            ("all_reduce", 8, 4),
        ]
