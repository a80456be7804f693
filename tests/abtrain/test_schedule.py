import pytest

from abtrain.method import schedule
from abtrain.method.schedule import Phase
from tests.helpers import tiny_config


def test_phase_sequence_for_a_given_schedule():
    cfg = tiny_config("steps=30", "ab.warmup_steps=6", "ab.ab_steps=5", "ab.rebound_steps=2")
    assert schedule.phases(cfg) == [
        (0, Phase("warmup")),
        (6, Phase("ab", 0)),
        (11, Phase("rebound", 0)),
        (13, Phase("ab", 1)),
        (18, Phase("rebound", 1)),
        (20, Phase("ab", 2)),
        (25, Phase("rebound", 2)),
        (27, Phase("ab", 3)),  # the run ends inside it: the trainer merges at the end
    ]


def test_baselines_are_full_rank_throughout():
    for method in ("ddp", "powersgd"):
        assert schedule.phases(tiny_config(f"method={method}")) == [(0, Phase("full"))]


def test_rebound_steps_zero_gives_back_to_back_ab_phases():
    cfg = tiny_config("steps=12", "ab.warmup_steps=2", "ab.ab_steps=4", "ab.rebound_steps=0")
    assert [p for _, p in schedule.phases(cfg)] == [
        Phase("warmup"),
        Phase("ab", 0),
        Phase("ab", 1),
        Phase("ab", 2),
    ]


def test_lr_rebound_restarts_near_zero_at_each_change_and_ramps_back():
    cfg = tiny_config(
        "steps=40",
        "optim.lr=1.0",
        "optim.min_lr=0.0",
        "optim.lr_warmup_steps=0",
        "ab.warmup_steps=10",
        "ab.ab_steps=8",
        "ab.rebound_steps=6",
        "ab.lr_rebound_steps=4",
    )
    lr, base = (lambda t: schedule.lr_at(t, cfg)), (lambda t: schedule.scheduled_lr(t, cfg))
    assert [schedule.last_change(t, cfg) for t in (9, 10, 17, 18, 23, 24)] == [
        None,
        10,
        10,
        18,
        18,
        24,
    ]
    for start in (10, 18, 24):  # end of warm-up, sync, switch to AB
        ramp = [lr(start + i) / base(start + i) for i in range(6)]
        assert ramp == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0, 1.0])
    assert lr(9) == base(9)  # no rebound inside the warm-up
    # the main schedule keeps advancing underneath: cosine from 1 to 0 over the run
    assert base(0) == pytest.approx(1.0) and base(39) == pytest.approx(0.0, abs=1e-12)
    assert base(18) < base(10)


def test_linear_lr_warmup_then_cosine():
    cfg = tiny_config("steps=20", "optim.lr=1.0", "optim.min_lr=0.1", "optim.lr_warmup_steps=4")
    assert [schedule.scheduled_lr(t, cfg) for t in range(4)] == pytest.approx([0.2, 0.4, 0.6, 0.8])
    assert schedule.scheduled_lr(4, cfg) == pytest.approx(1.0)
    assert schedule.scheduled_lr(19, cfg) == pytest.approx(0.1)


def test_authors_rule_syncs_at_multiples_of_the_period_and_keeps_the_first_ab_phase_whole():
    # W/S/R = 7/5/2: AB from 7 to the first multiple of 5 after it (10), then every 5 steps
    # a sync, 2 rebound steps and S - R = 3 AB steps
    cfg = tiny_config(
        "steps=22", "ab.warmup_steps=7", "ab.ab_steps=3", "ab.rebound_steps=2",
        "ab.phase_rule=authors",
    )  # fmt: skip
    assert schedule.phases(cfg) == [
        (0, Phase("warmup")),
        (7, Phase("ab", 0)),
        (10, Phase("rebound", 0)),
        (12, Phase("ab", 1)),
        (15, Phase("rebound", 1)),
        (17, Phase("ab", 2)),
        (20, Phase("rebound", 2)),
    ]
    assert [schedule.last_change(t, cfg) for t in (6, 7, 9, 10, 11, 12, 21)] == [
        None, 7, 7, 10, 10, 12, 20,
    ]  # fmt: skip


@pytest.mark.parametrize(
    "steps, w, s, r, share",
    [  # the authors' ResNet-50 constant-local-batch runs on 2 and 4 nodes, and their ViT
        (90000, 24000, 6000, 300, 0.30),
        (45000, 9300, 3000, 300, 0.28),
        (45000, 12300, 2180, 300, 0.3733),  # 15 syncs (reference notes, section 1)
    ],
)
def test_authors_rule_gives_their_share_of_full_rank_steps(steps, w, s, r, share):
    cfg = tiny_config(
        f"steps={steps}", f"ab.warmup_steps={w}", f"ab.ab_steps={s - r}",
        f"ab.rebound_steps={r}", "ab.phase_rule=authors",
    )  # fmt: skip
    bounds = schedule.phases(cfg) + [(steps, None)]
    full = sum(
        end - start
        for (start, p), (end, _) in zip(bounds, bounds[1:])
        if p.kind in ("warmup", "rebound")
    )
    assert full / steps == pytest.approx(share, abs=0.001)
