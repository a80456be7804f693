"""The paper profile runs what the authors ran: their run lengths and, under their phase
rule, their share of full-rank steps, for every AB run of the matrix."""

import pytest
import torch
import yaml

from abtrain import config
from abtrain.method import methods, schedule
from abtrain.predict import traffic
from pipeline.matrix import run_overrides, runs
from tests.helpers import ROOT

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
    assert cfg.ab.phase_rule == "authors"
    # their paper runs (c3dbc10) factorised every layer; the no-groups runs follow HEAD
    # (c23240c: first and last layer full rank, null); the committed VGG config keeps two
    want = {"ab_nogroups": None}.get(run.method, [])
    assert cfg.ab.full_rank_layers == (
        want if name != "vgg-abng-node-2n" else ["features.0", "head.fc"]
    )
    # the LR warm-up in the authors' whole steps: 10 of 150 epochs (6,000 of 90,000)
    assert cfg.optim.lr_warmup_steps * 15 == cfg.steps
    full = sum(schedule.phase_at(t, cfg).kind in ("warmup", "rebound") for t in range(cfg.steps))
    assert full / cfg.steps == pytest.approx(authors_full_rank_share(steps, w, s, r), abs=0.02)
    assert run.source and ("@c3dbc10 " in run.source or "@c23240c " in run.source)


def test_the_authors_hyperparameters_are_the_runs():
    def cfg(name, size=IMAGENET):
        run = runs(PAPER)[name]
        return config.from_dict(PAPER["train"], run_overrides(PAPER, run, None, size=size))

    vit = cfg("vit-ab-4n-global").model
    assert vit.arch == "vit_base_patch16_224" and vit.kwargs["drop_path_rate"] == 0.1
    assert vit.kwargs["qkv_bias"] is False
    r50 = cfg("r50-ab-4n-local")
    assert r50.model.arch == "resnet50" and r50.model.kwargs["drop_rate"] == 0.1
    assert r50.dist.sync_batchnorm == "world"  # theirs
    assert r50.optim.weight_decay == 0.1
    assert cfg("r50-ab-4n-global").optim.weight_decay == 0.01  # their common0.01.yaml
    vgg = cfg("vgg-ab-2n", CIFAR10)
    assert vgg.optim.lr == 0.003 and vgg.steps == 15000
    assert vgg.model.factory == "abtrain.models.vgg:vgg16" and vgg.model.kwargs["width"] == 64


def authors_lr_restarts(steps: int, w: int, s: int, r: int) -> set[int]:
    """Every step at which their trainer restarts the LR ramp (`reset_lr_on_sync`): each
    transition of their rule, the switch back to AB inside an AB phase included."""
    return {t for t in range(w, steps) if t == w or t % s == 0 or (t > s and t % s == r)}


@pytest.mark.parametrize("name", ["r50-ab-2n-local", "r50-ab-4n-local", "vit-ab-4n-global"])
def test_the_lr_ramp_restarts_where_the_authors_trainer_restarts_it(name):
    """r50-2n-local (W/S/R 24000/6000/300): W mod S < R, so their switch back to AB at
    24,300 falls inside the first AB phase and restarts the ramp with no change of phase."""
    run = runs(PAPER)[name]
    cfg = config.from_dict(PAPER["train"], run_overrides(PAPER, run, None, size=IMAGENET))
    ab = cfg.ab
    ours = {schedule.last_change(t, cfg) for t in range(cfg.steps)} - {None}
    period = ab.ab_steps + ab.rebound_steps
    assert ours == authors_lr_restarts(cfg.steps, ab.warmup_steps, period, ab.rebound_steps)
    if name == "r50-ab-2n-local":
        assert schedule.phase_at(24300, cfg) == schedule.phase_at(24299, cfg)  # no new phase
        assert schedule.lr_at(24300, cfg) < schedule.lr_at(24299, cfg) / 100  # but a new ramp


# A search result nothing in the paper profile should take, but the schedule's fractions
MADE_UP_BEST = {
    "backend": "propulate",
    "error": 50.0,
    "params": {
        "optim.lr": 0.0009,
        "optim.weight_decay": 0.2,
        "ab.warmup_steps": 0.25,
        "ab.ab_steps": 0.05,
        "ab.rebound_steps": 0.02,
        "ab.lr_rebound_steps": 0.04,
        "ab.sigma_cutoff": 0.33,
        "ab.sync_mode": "only_learned",
        "ab.group_size": 2,
    },
}
SCHEDULE_KEYS = ("ab.warmup_steps", "ab.ab_steps", "ab.rebound_steps", "ab.lr_rebound_steps")


@pytest.mark.parametrize("name", list(runs(PAPER)))
def test_a_search_result_reaches_the_runs_only_through_the_schedule(name):
    """With a search result on disk, every run keeps the authors' lr, weight decay, σ cutoff
    and sync mode; the search's schedule fractions apply where the run has none of its own,
    and the provenance lines say so."""
    from pipeline.matrix import provenance, resolve

    run = runs(PAPER)[name]
    size = CIFAR10 if name.startswith("vgg") else IMAGENET
    resolved = resolve(PAPER, run, MADE_UP_BEST, size)
    cfg = config.from_dict(PAPER["train"], [o.text for o in resolved])
    assert cfg.optim.lr == (0.003 if name.startswith("vgg") else 0.0035)
    own_wd = [s for s in run.set if s.startswith("optim.weight_decay=")]
    assert cfg.optim.weight_decay == (0.01 if own_wd else 0.1)
    assert cfg.ab.sigma_cutoff == 0.15 and cfg.ab.sync_mode == "with_stale"
    assert cfg.ab.group_size == (4 if name == "vgg-abng-node-2n" else None)
    lines = provenance(PAPER, resolved)
    if not methods.kind(run.method).low_rank:  # its ab.* change nothing: counted, not listed
        assert not any(line.startswith(SCHEDULE_KEYS) for line in lines), lines
        return
    searched = [line for line in lines if "<- search best" in line]
    assert all(line.startswith(SCHEDULE_KEYS) for line in searched), searched
    for key in SCHEDULE_KEYS:  # a run's own value wins, and the line shows what it replaced
        own = next((s for s in run.set if s.startswith(f"{key}=")), None)
        line = next(line for line in lines if line.startswith(f"{key}="))
        if own:
            assert line.startswith(f"{own}  <- experiments.runs.{name}.set")
            assert "from search best (propulate)" in line
        else:
            assert "<- search best (propulate)" in line


@pytest.mark.slow  # builds the paper's ResNet-50: ~50 s of CPU
def test_resnet50_starts_each_block_as_its_shortcut():
    """timm's resnet50, the authors' model: γ = 0 in every block's last BatchNorm."""
    from abtrain import models

    r50 = config.from_dict(
        PAPER["train"], run_overrides(PAPER, runs(PAPER)["r50-ab-4n-local"], None, size=IMAGENET)
    )
    assert r50.model.kwargs["zero_init_last"]
    model = models.build(r50, 10)
    last = [b.bn3.weight for layer in ("layer1", "layer2", "layer3", "layer4")
            for b in getattr(model, layer)]  # fmt: skip
    assert len(last) == 16 and all(float(w.detach().abs().max()) == 0.0 for w in last)
    assert float(model.bn1.weight.detach().min()) == 1.0  # the others keep γ = 1


def nogroups_config(version: str, name: str, size: int = IMAGENET) -> config.Config:
    p = {**PAPER, "experiments": {**PAPER["experiments"], "nogroups": version}}
    return config.from_dict(p["train"], run_overrides(p, runs(p)[name], None, size=size))


def test_no_groups_runs_are_the_authors_head_by_default():
    """c23240c: one group of the world training B = Σ^½Vᵀ, B averaged at the sync, and
    the layers their full_rank_sync_names keep (patch_embed/head, conv1/fc) full rank."""
    from abtrain import models
    from abtrain.method import lowrank

    assert PAPER["experiments"]["nogroups"] == "c23240c"
    for name, run in runs(PAPER).items():
        if run.method != "ab_nogroups":
            continue
        assert not any(s.startswith("ab.split_sigma") for s in run.set), name
        src = run.source
        assert src.startswith("extrapolated:") or "@c23240c configs/" in src, name
        cfg = nogroups_config("c23240c", name, CIFAR10 if name.startswith("vgg") else IMAGENET)
        assert cfg.ab.split_sigma and cfg.ab.sync_mode == "with_stale", name
        if name != "vgg-abng-node-2n":
            assert cfg.ab.group_size is None and methods.check_world(cfg, run.world, 4) == (
                run.world
            )
    cfg = nogroups_config("c23240c", "vit-abng-4n-local")
    with torch.device("meta"):
        vit = models.build(cfg, 1000)
    kept = lowrank.kept_full_rank(lowrank.survey(vit, cfg.ab.full_rank_layers))
    assert list(kept) == ["patch_embed.proj", "head"]  # theirs: patch_embed.proj, head
    node = runs(PAPER)["vgg-abng-node-2n"]
    assert "ab.group_size=4" in node.set and "ab_2nodes.yaml as committed" in node.source
    cfg = nogroups_config("c23240c", "vgg-abng-node-2n", CIFAR10)
    assert cfg.ab.full_rank_layers == ["features.0", "head.fc"]
    assert methods.check_world(cfg, 8, 4) == 4  # B trained inside each node


def test_no_groups_runs_as_the_scaling_runs_code_ran_them():
    """c3dbc10: group size -1 made two half-world groups, only-b forced B = ΣVᵀ, every
    layer was factorised and the sync averaged nothing: rank 0's W went to every rank."""
    from abtrain.distributed import groups

    cfg = nogroups_config("c3dbc10", "r50-abng-8n-global")
    assert not cfg.ab.split_sigma and cfg.ab.full_rank_layers == []
    assert cfg.ab.sync_mode == "rank0"
    size = methods.check_world(cfg, 32, 4)
    assert groups.roles(32, size, all_train_b=True) == [
        (list(range(16)), "b"),
        (list(range(16, 32)), "b"),
    ]
    with pytest.raises(config.ConfigError, match="experiments.nogroups: 'c0ffee'"):
        nogroups_config("c0ffee", "r50-abng-8n-global")


def test_the_early_stopping_is_the_authors_where_they_used_it():
    imagenet = config.from_dict(PAPER["train"]).early_stopping
    assert [(r.after, r.min_top1) for r in imagenet] == [
        (0.05, 1.5), (0.1, 4.0), (0.3, 5.5), (0.5, 7.0), (0.75, 7.5)
    ]  # fmt: skip
    vgg = config.from_dict(
        PAPER["train"], run_overrides(PAPER, runs(PAPER)["vgg-ab-2n"], None, size=CIFAR10)
    )
    assert vgg.early_stopping == []  # their CIFAR-10 common.yaml: use_early_stopping False


def test_both_two_node_weight_decays_of_the_authors_are_runs():
    """c3dbc10 has two 2-node ResNet-50 files each (common.yaml 0.1, common0.01.yaml 0.01),
    both named ab-2k: the profile runs both, each paired with its own ddp run."""
    from pipeline.report.tables import baseline

    def wd(name):
        run = runs(PAPER)[name]
        return config.from_dict(PAPER["train"], run_overrides(PAPER, run, None, size=IMAGENET))

    assert wd("r50-ab-2n-local").optim.weight_decay == 0.1
    assert wd("r50-ab-2n-local-wd0.01").optim.weight_decay == 0.01
    assert wd("r50-ddp-2n-local-wd0.01").optim.weight_decay == 0.01
    scale = dict(
        nodes=2,
        ranks_per_node=4,
        batch="local",
        global_batch=2048,
        model="resnet50",
        data="imagenet",
    )
    done = {
        n: {"method": m, "run": {"name": n, **scale}}
        for n, m in [
            ("r50-ddp-2n-local", "ddp"),
            ("r50-ddp-2n-local-wd0.01", "ddp"),
            ("r50-ab-2n-local-wd0.01", "ab"),
            ("r50-ab-2n-local", "ab"),
        ]
    }
    assert baseline(done, done["r50-ab-2n-local-wd0.01"])["run"]["name"].endswith("wd0.01")
    assert baseline(done, done["r50-ab-2n-local"])["run"]["name"] == "r50-ddp-2n-local"


@pytest.mark.parametrize(
    "name,wide,layers,ratio",
    [("r50-ab-4n-local", 33, 54, 3.30), ("vit-ab-4n-local", 12, 50, 1.72)],
)
def test_b_is_the_authors_short_side_and_the_planner_counts_it(name, wide, layers, ratio):
    """The authors turn a wide matrix upright before the SVD, so B is k x min(m, n): the
    out x in·kh·kw view's B would be `ratio` times as large over the model at full rank."""
    from abtrain import models
    from abtrain.method import lowrank

    cfg = config.from_dict(PAPER["train"], run_overrides(PAPER, runs(PAPER)[name], None, IMAGENET))
    with torch.device("meta"):
        model = models.build(cfg, 1000)
    chosen = [c for c in lowrank.survey(model, cfg.ab.full_rank_layers) if c.factorised]
    assert (sum(c.rows < c.cols for c in chosen), len(chosen)) == (wide, layers)
    short = sum(c.full_rank * min(c.rows, c.cols) for c in chosen)
    out_by_in = sum(c.full_rank * c.cols for c in chosen)
    assert out_by_in / short == pytest.approx(ratio, abs=0.005)
    long = sum(c.full_rank * max(c.rows, c.cols) for c in chosen)
    s = traffic.sizes(cfg, 1000)
    assert (s.a, s.b) == (4 * long, 4 * short)  # fp32 bytes of A and B at full rank


def test_each_run_trains_at_the_papers_three_seeds_and_reports_mean_and_sd():
    from pathlib import Path

    from pipeline.report.tables import top1_diff
    from pipeline.train import over_seeds, seed_folders

    assert PAPER["experiments"]["seeds"] == 3
    folders = seed_folders(PAPER, "vit-ab-4n-local")
    first = Path("runs/train/vit-ab-4n-local")
    assert folders == [(0, first), (1, first / "seeds" / "1"), (2, first / "seeds" / "2")]

    def summary(seed, best):
        return dict(
            seed=seed,
            val_top1=dict(best=best, final=best - 1),
            compression_ratio=1.0,
            traffic=dict(inter_node_bytes=10),
            wall_seconds=1.0,
        )

    ab = over_seeds([summary(0, 70.0), summary(1, 72.0), summary(2, 74.0)])
    ddp = over_seeds([summary(0, 71.0), summary(1, 72.0), summary(2, 76.0)])
    assert ab["val_top1"]["best"] == 72.0 and ab["val_top1"]["best_sd"] == pytest.approx(2.0)
    assert [s["seed"] for s in ab["seeds"]] == [0, 1, 2]
    diff = top1_diff(ab, ddp)  # paired seed by seed: -1, 0, -2
    assert diff["diff_top1"] == pytest.approx(-1.0) and diff["diff_top1_sd"] == pytest.approx(1.0)
    one = over_seeds([summary(0, 70.0)])
    assert (
        "seeds" not in one
        and top1_diff(one, over_seeds([summary(0, 71.0)]))["diff_top1_sd"] is None
    )
    with pytest.raises(config.ConfigError, match="experiments.seeds must be a count"):
        seed_folders({**PAPER, "experiments": {**PAPER["experiments"], "seeds": 0}}, "x")
