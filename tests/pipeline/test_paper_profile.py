"""The paper profile runs what the authors ran: their run lengths and, under their phase
rule, their share of full-rank steps, for every AB run of the matrix."""

import pytest
import yaml

from abtrain import config, schedule
from pipeline.common import run_overrides, runs
from tests.conftest import ROOT

PAPER = yaml.safe_load((ROOT / "profiles" / "paper.yaml").read_text())
IMAGENET, CIFAR10 = 1_281_167, 50_000
# The authors' iterations and W/S/R per (model, nodes, batch), from their configs at c3dbc10
# (shared/reference/authors-code.md, section 5)
AUTHORS = {
    ("r50", 2, "local"): (90000, 24000, 6000, 300),
    ("r50", 4, "local"): (45000, 9300, 3000, 300),
    ("r50", 8, "local"): (22500, 6150, 1500, 150),
    ("r50", 16, "local"): (11250, 3750, 600, 75),
    ("r50", 32, "local"): (5700, 1900, 400, 38),
    ("vit", 2, "local"): (90000, 24600, 4360, 600),
    ("vit", 4, "local"): (45000, 12300, 2180, 300),
    ("vit", 8, "local"): (22500, 6150, 1500, 150),
    ("vit", 16, "local"): (11250, 3075, 750, 75),
    ("vit", 32, "local"): (5700, 1520, 270, 38),
    ("vgg", 2, "local"): (15000, 4330, 759, 60),
}
for nodes in (4, 8, 16, 32):
    AUTHORS["r50", nodes, "global"] = (45000, 9300, 3000, 300)
    AUTHORS["vit", nodes, "global"] = (45000, 12300, 2180, 300)


def authors_full_rank_share(steps: int, w: int, s: int, r: int) -> float:
    """Their trainer's rule, simulated from its description: after t completed iterations,
    t == W starts AB; t > W and t % S == 0 syncs to full rank; t > S and t % S == R goes
    back to AB. Counts the iterations trained at full rank."""
    full_rank, full = True, 0
    for t in range(1, steps + 1):
        full += full_rank
        if t < w:
            continue
        if t == w:
            full_rank = False
        elif t % s == 0:
            full_rank = True
        elif t > s and t % s == r:
            full_rank = False
    return full / steps


AB_RUNS = [n for n, r in runs(PAPER).items() if r.method != "ddp"]


@pytest.mark.parametrize("name", AB_RUNS)
def test_every_ab_run_has_the_authors_length_and_share_of_full_rank_steps(name):
    run = runs(PAPER)[name]
    model = name.split("-")[0]
    steps, w, s, r = AUTHORS[model, run.nodes, run.batch]
    size = CIFAR10 if model == "vgg" else IMAGENET
    cfg = config.from_dict(PAPER["train"], run_overrides(PAPER, run, None, size=size))
    assert cfg.steps == pytest.approx(steps, rel=0.03)
    assert cfg.ab.phase_rule == "authors" and cfg.ab.full_rank_layers == []
    full = sum(schedule.phase_at(t, cfg).kind in ("warmup", "rebound") for t in range(cfg.steps))
    assert full / cfg.steps == pytest.approx(authors_full_rank_share(steps, w, s, r), abs=0.02)
    assert run.source and "c3dbc10" in run.source


def test_the_authors_hyperparameters_are_the_runs():
    def cfg(name, size=IMAGENET):
        run = runs(PAPER)[name]
        return config.from_dict(PAPER["train"], run_overrides(PAPER, run, None, size=size))

    assert cfg("vit-ab-4n-global").model.drop_path == 0.1
    r50 = cfg("r50-ab-4n-local")
    assert r50.model.dropout == 0.1 and r50.dist.sync_batchnorm
    assert r50.optim.weight_decay == 0.1
    assert cfg("r50-ab-4n-global").optim.weight_decay == 0.01  # their common0.01.yaml
    vgg = cfg("vgg-ab-2n", CIFAR10)
    assert vgg.optim.lr == 0.003 and vgg.steps == 15000 and vgg.model.layout == "timm"
