"""Where the paper profile follows the authors' committed code (docs/choices.md): the ReaL
subset as they scored it, their first step and rebound of the learning rate, one data
order for every seed; and the sizes the page quotes of what abtrain leaves out."""

from __future__ import annotations

import json
import math
import types

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from abtrain import config as abconfig
from abtrain.data import prepare
from abtrain.data.loader import StepSampler
from abtrain.data.sources import DataError, _Tree
from abtrain.method import schedule
from abtrain.predict import traffic
from pipeline import matrix
from tests.helpers import PARAMS, ROOT

PAPER = yaml.safe_load((ROOT / "profiles" / "paper.yaml").read_text())
IMAGENET_TRAIN = 1_281_167


def paper_run(name: str, *more: str) -> abconfig.Config:
    run = matrix.runs(PAPER)[name]
    sets = [o.text for o in matrix.resolve(PAPER, run, None, size=IMAGENET_TRAIN)]
    return abconfig.from_dict(PAPER["train"], [*sets, *more])


# ---------------------------------------------------------------- ReaL
def write_val(root, classes: dict[str, list[int]]) -> None:
    """val/<class>/ILSVRC2012_val_<number>.JPEG, and a train/ of one image per class."""
    for cls, numbers in classes.items():
        for split, names in (("val", numbers), ("train", [numbers[0]])):
            (root / split / cls).mkdir(parents=True, exist_ok=True)
            for n in names:
                pixels = np.full((8, 8, 3), n * 20, dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / cls / f"ILSVRC2012_val_{n:08d}.JPEG")


def test_the_real_subset_as_the_authors_scored_it_on_a_tree_whose_class_order_is_not_file_order(
    tmp_path,
):
    """n01 holds files 3, 4, 5 and n02 files 1, 2, 6: ImageFolder lists them 3, 4, 5, 1, 2,
    6. real.json's entries follow file numbers; the authors deleted by position in that
    list. Same counts either way (so a count can't tell), other images."""
    import torchvision

    write_val(tmp_path / "tree", {"n01": [3, 4, 5], "n02": [1, 2, 6]})
    real = [[0], [], [0, 1], [1], [], [1]]
    (tmp_path / "real.json").write_text(json.dumps(real))
    tree = _Tree(tmp_path / "tree")
    kept = {}
    for rule in ("labelled", "authors"):
        y, members = prepare._select(tree, "val", 0, str(tmp_path / "real.json"), rule)
        kept[rule] = [int(m.split("_")[-1].split(".")[0]) for m in members]
        assert y.tolist() == [0, 0, 1, 1]
    assert kept["labelled"] == [3, 4, 1, 6]  # each file by its own number
    assert kept["authors"] == [3, 5, 1, 6]
    # the authors' own code: torchvision's ImageFolder, then their reversed `del` loop
    folder = torchvision.datasets.ImageFolder(tmp_path / "tree" / "val")
    for p in reversed([i for i, entry in enumerate(real) if not entry]):
        del folder.samples[p]
    theirs = [int(path.split("_")[-1].split(".")[0]) for path, _ in folder.samples]
    assert theirs == kept["authors"]
    with pytest.raises(DataError, match="needs the whole validation set"):
        prepare.authors_real_keep(["a", "b"], real, "real.json")


def test_real_subset_goes_with_real_labels_and_only_with_it():
    image = dict(
        name="imagenet", source="x", sha256=None, prepared="p", train_per_class=0,
        val_per_class=0, image_size=224, augment=False, workers=0,
    )  # fmt: skip
    abconfig.ImageData(**image, real_labels="real.json", real_subset="authors")
    abconfig.ImageData(**image, real_labels=None)
    for bad in (dict(real_labels="real.json"), dict(real_labels=None, real_subset="authors")):
        with pytest.raises(ValueError, match="data.real_subset"):
            abconfig.ImageData(**image, **bad)
    assert PAPER["train"]["data"]["real_subset"] == "authors"


# ---------------------------------------------------------------- the learning rate
WARMUP_LR = 1e-5  # the authors' warmup_lr, min_lr and rebound floor


def authors_lrs(cfg: abconfig.Config, updates_per_epoch: int) -> list[float]:
    """The authors' loop (c3dbc10) replayed: their AdamW and timm scheduler, built in their
    order (the scheduler first, then their trainer's new param groups), stepped once per
    update, and their rebound (_setup_lr_rebound, _pre_forward) at each switch."""
    from timm.scheduler import create_scheduler

    w = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([w], lr=cfg.optim.lr)
    warm = cfg.optim.lr_warmup_steps // updates_per_epoch
    epochs = round(cfg.steps / updates_per_epoch)
    args = types.SimpleNamespace(
        sched="cosine", epochs=epochs - warm, warmup_epochs=warm, cooldown_epochs=10,
        min_lr=WARMUP_LR, warmup_lr=WARMUP_LR, warmup_prefix=True, lr_cycle_mul=1.5,
        lr_cycle_limit=30, lr_cycle_decay=0.4, lr_k_decay=1.0, sched_on_updates=True,
    )  # fmt: skip
    sched, _ = create_scheduler(args, opt, updates_per_epoch=updates_per_epoch)
    opt.param_groups = []
    opt.add_param_group({"params": [w]})  # their trainer's groups, at AdamW's lr
    ab = cfg.ab
    big, small = ab.ab_steps + ab.rebound_steps, ab.rebound_steps
    pg, ramp, i, f, out, total = opt.param_groups[0], False, 0, 0.0, [], 0
    for it in range(cfg.steps):
        if it % updates_per_epoch == 0:
            sched.step(total // updates_per_epoch)  # per epoch: nothing, on updates
        if ramp:
            i += 1
            pg["lr"] = min(pg["lr"], f * i)
            ramp = i < ab.lr_rebound_steps
        out.append(pg["lr"])
        total += 1
        sched.step_update(num_updates=total)
        switch = total == ab.warmup_steps or (total > ab.warmup_steps and total % big == 0)
        switch |= total > ab.warmup_steps and total > big and total % big == small
        if switch:
            ramp, i, f = True, 0, (pg["lr"] - WARMUP_LR) / ab.lr_rebound_steps
            pg["lr"] = WARMUP_LR
    return out


@pytest.mark.parametrize("name, updates", [("vit-ab-4n-local", 300), ("r50-ab-2n-local", 600)])
def test_the_paper_profiles_learning_rate_is_the_authors_at_every_step(name, updates):
    pytest.importorskip("timm")
    cfg = paper_run(name)
    assert (cfg.optim.schedule, cfg.ab.lr_rebound) == ("authors", "authors")
    assert cfg.steps == updates * 150
    theirs = authors_lrs(cfg, updates)
    ours = [schedule.lr_at(t, cfg) for t in range(cfg.steps)]
    assert ours == pytest.approx(theirs, rel=1e-9, abs=1e-12)
    # by the formulas: the first step at the peak, then the warm-up from 1e-5
    w = cfg.optim.lr_warmup_steps
    assert ours[0] == cfg.optim.lr == 0.0035
    assert ours[1] == pytest.approx(WARMUP_LR + (cfg.optim.lr - WARMUP_LR) / w)
    assert ours[2] == pytest.approx(WARMUP_LR + 2 * (cfg.optim.lr - WARMUP_LR) / w)
    # abtrain's own schedule and rebound start near 0 and ramp by a factor
    mine = paper_run(name, "optim.schedule=abtrain", "ab.lr_rebound=abtrain")
    assert schedule.lr_at(0, mine) == pytest.approx(cfg.optim.lr / (w + 1))


def test_the_authors_rebound_by_hand():
    """A change at step 10, N = 4 steps of ramp, under a schedule of 1.0: 1e-5 first, then
    min(schedule, f·i), f = (1 - 1e-5)/4."""
    cfg = abconfig.from_dict(
        yaml.safe_load(PARAMS.read_text())["train"],
        [
            "steps=40", "ab.warmup_steps=10", "ab.ab_steps=8", "ab.rebound_steps=2",
            "ab.lr_rebound_steps=4", "ab.lr_rebound=authors", "ab.phase_rule=algorithm1",
        ],
    )  # fmt: skip
    f = (1.0 - WARMUP_LR) / 4
    got = [schedule.rebound_lr(t, cfg, lambda _: 1.0) for t in range(9, 16)]
    assert got == pytest.approx([1.0, WARMUP_LR, 2 * f, 3 * f, 4 * f, 1.0, 1.0])


# ---------------------------------------------------------------- the data's order
def test_the_paper_profile_reads_the_data_in_one_order_at_every_seed():
    first, second = (paper_run("vit-ab-4n-local", f"seed={s}") for s in (0, 1))
    assert first.data_seed == second.data_seed == 0
    samplers = [
        StepSampler(IMAGENET_TRAIN, 256, 3, 16, c.seed, c.data_seed) for c in (first, second)
    ]
    epoch = samplers[0].steps_per_epoch
    for step in (0, epoch, 2 * epoch + 5):
        assert torch.equal(samplers[0].indices(step), samplers[1].indices(step))
    # the augmentations still follow the run's seed
    assert samplers[0].generator(5).initial_seed() != samplers[1].generator(5).initial_seed()
    # the default profile: the run's seed orders the data
    default = [StepSampler(10_000, 32, 0, 4, s, None).indices(0) for s in (0, 1)]
    assert not torch.equal(*default)


# ---------------------------------------------------------------- what abtrain leaves out
def test_the_sizes_docs_choices_quotes():
    vit, r50 = paper_run("vit-ab-4n-local"), paper_run("r50-ab-4n-local")
    w = traffic.authors_w_allreduce(vit, 4, 4, 1000)
    assert (w["bytes"], w["inter_bytes_per_sync"]) == (345_169_920, 161_798_400)
    total = traffic.estimate(vit, 4, 4, 1000).inter_bytes
    assert math.isclose(w["syncs"] * w["inter_bytes_per_sync"] / total, 0.0009, abs_tol=5e-5)
    w = traffic.authors_w_allreduce(r50, 4, 4, 1000)
    assert (w["bytes"], w["inter_bytes_per_sync"]) == (102_011_648, 47_817_960)
    # ab_nogroups' sync: ResNet-50's float buffers, averaged over the world
    s = traffic.sizes(r50, 1000)
    assert (s.float_buffers, s.float_buffer_bytes) == (106, 212_480)
    assert traffic.ring_inter(s.float_buffer_bytes, 4, 16) == 99_600
    assert round(2 * 15 / 16 * s.float_buffer_bytes) == 398_400


# ---------------------------------------------------------------- validation
@pytest.mark.multiprocess
def test_a_bf16_run_is_validated_in_float32_with_the_criterion_val_loss_names(tmp_path):
    """A run trained under bf16 autocast reports the loss and top-1 of its final model
    evaluated in float32 (as the authors validate); `val_loss: smoothed` is the training's
    label-smoothed cross-entropy (the authors'), `plain` without smoothing."""
    import torch.nn.functional as F

    from abtrain.data import datasets
    from abtrain.models import build
    from tests.helpers import launch, summary, tiny_config

    sets = ("method=ddp", "steps=20", "eval_every=20", "bf16=true", "optim.label_smoothing=0.3")
    reported = {}
    for kind in ("smoothed", "plain"):
        out = tmp_path / kind
        proc = launch(out, *sets, f"val_loss={kind}", nnodes=1, nproc=1)
        assert proc.returncode == 0, proc.stderr[-3000:]
        reported[kind] = summary(out)["evals"][-1]
    cfg = tiny_config(*sets)
    task = datasets.make_task(cfg)
    model = build(cfg, task.classes, task.features)
    model.load_state_dict(torch.load(tmp_path / "plain" / "model.pt", weights_only=True))
    model.eval()

    def scored(smoothing: float, bf16: bool) -> tuple[float, float]:
        loss = top1 = n = 0.0
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            for x, y in task.val_batches(0, 1, 4 * cfg.batch_size):
                logits = model(x).float()
                loss += F.cross_entropy(
                    logits, y, reduction="sum", label_smoothing=smoothing
                ).item()
                top1 += (logits.argmax(1) == y).sum().item()
                n += len(y)
        return loss / n, 100 * top1 / n

    plain, smoothed = scored(0.0, bf16=False), scored(0.3, bf16=False)
    rounded = scored(0.0, bf16=True)[0]  # bf16's rounding of the same model's loss
    gap = abs(reported["plain"]["val_loss"] - plain[0])
    assert gap < abs(rounded - plain[0]) / 10, (gap, rounded, plain[0])
    assert reported["smoothed"]["val_loss"] == pytest.approx(smoothed[0], rel=1e-6)
    assert abs(smoothed[0] - plain[0]) > 1e-2  # the two criteria told apart
    assert reported["plain"]["val_top1"] == plain[1] == reported["smoothed"]["val_top1"]
