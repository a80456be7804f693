"""DiLoCo's outer step on two real gloo ranks, against the arithmetic written out by hand:
the pseudo-gradient averaged over the world, SGD with Nesterov momentum on the outer
weights, every rank set to the result."""

import pytest
import torch
from torch import nn

from abtrain.distributed.ledger import Ledger
from abtrain.method.outer import OuterStep
from tests.helpers import spawn

LR, MU = 0.7, 0.9


def _two_outer_steps(rank, world):
    model = nn.Linear(3, 2)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(1.0)
    outer = OuterStep(model, LR, MU)
    outer.begin()
    ledger = Ledger(rank, [0, 1], keep_rows=True)
    seen = []
    for moved in (0.1, 0.3):  # each rank trains its weights down by a different amount
        with torch.no_grad():
            for p in model.parameters():
                p.sub_(moved * (rank + 1))
        outer.step(ledger)
        seen.append(model.weight[0, 0].item())
    state = outer.state_dict()
    return seen, state["momentum"][0][0, 0].item(), ledger.view()["total_bytes"]


@pytest.mark.multiprocess
def test_the_outer_step_averages_the_pseudo_gradient_and_takes_a_nesterov_step():
    results = spawn(_two_outer_steps, world=2, ranks_per_node=1)
    # by hand: Δ = mean over ranks of (anchor - node); b = μ·b + Δ; anchor -= lr·(Δ + μ·b)
    anchor, b, want = 1.0, 0.0, []
    for moved in (0.1, 0.3):
        delta = (moved * 1 + moved * 2) / 2  # ranks 0 and 1 moved by moved·(rank+1)
        b = MU * b + delta
        anchor -= LR * (delta + MU * b)
        want.append(anchor)
    for seen, momentum, sent in results:  # every rank holds the same outer result
        assert seen == pytest.approx(want, abs=1e-6)
        assert momentum == pytest.approx(b, abs=1e-6)
        # the all-reduces are counted by the ledger
        assert sent > 0
    assert results[0][0] == results[1][0]
