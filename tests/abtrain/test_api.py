"""The method as a component (`abtrain.ABTraining`) in loops that are not abtrain's: timm
models abtrain never wrote through every phase on 2 "nodes" of real gloo ranks, a plain
loop against `abtrain train` bit for bit, and the example under torchrun."""

import copy
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from abtrain import models
from abtrain.method import schedule, sync
from tests.helpers import ROOT, launch, spawn, summary, tiny_config

# A ViT, a ResNet, a ConvNeXt (depthwise 7×7 convs) and a RegNet (grouped convs), shrunk to
# CPU size through timm's own arguments; 32 px inputs.
FAMILIES = {
    "vit": ("vit_tiny_patch16_224", dict(img_size=32, patch_size=8, depth=2)),
    "resnet": ("resnet10t", {}),
    "convnext": ("convnext_atto", dict(depths=(1, 1, 1, 1))),
    "regnet": ("regnetx_002", {}),
}
# warm-up 0-1, AB 2-4, sync + rebound 5, AB 6-7, the final sync: every phase and two syncs
SCHEDULE = ("steps=8", "ab.warmup_steps=2", "ab.ab_steps=3", "ab.rebound_steps=1")
SCHEDULE += ("ab.lr_rebound_steps=1", "method=ab")
CUT = 4  # the step a run is checkpointed at, inside an AB phase


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 10, (8,), generator=g)


def _build(arch: str, kwargs: dict, cfg):
    import timm

    from abtrain.method.abtraining import ABTraining

    torch.manual_seed(0)
    model = timm.create_model(arch, pretrained=False, num_classes=10, **kwargs)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    return model, opt, ABTraining(model, opt, cfg, ledger_rows=True)


def _train(ab, opt, rank: int, steps: range) -> None:
    for step in steps:
        net = ab.module(step)
        for g in opt.param_groups:
            g["lr"] = 1e-3 * ab.lr_factor(step)
        x, y = _batch(rank, step)
        loss = F.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


def _families(rank: int, world: int) -> dict:
    """Per family: the phases seen, outputs before/after each merge, the sync's payload
    against the factor sizes, and a resumed run against the uninterrupted one."""
    cfg = tiny_config(*SCHEDULE)
    probe = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(7))
    out = {}
    for family, (arch, kwargs) in FAMILIES.items():
        model, opt, ab = _build(arch, kwargs, cfg)
        merges = []
        real_merge = sync.merge

        def merge_and_compare(layers, model=model, ab=ab, opt=opt, merges=merges, real=real_merge):
            # the A·B model just before the merge (factors averaged), then the merged one
            model.eval()
            with torch.no_grad():
                before = model(probe)
                real(layers)
                after = model(probe)
            model.train()
            rows = [r for r in ab.ledger.rows if r["phase"] == "sync"]
            factors = sum(m.a.numel() + m.b.numel() for m in layers.values())
            shared = sum(t.numel() for t in sync.shared_state(model, layers))
            moments = sum(
                2 * p.numel() for p in sync.shared_params(model, layers) if p in opt.state
            )
            merges.append(
                dict(
                    err=(before - after).abs().max().item(),
                    scale=before.abs().max().item(),
                    payload=[r["payload_bytes"] for r in rows],
                    expected=4 * (factors + shared + moments),
                    wire=[r["wire_bytes"] for r in rows],
                )
            )
            ab.ledger.rows.clear()

        sync.merge = merge_and_compare
        try:
            phases = []
            for step in range(cfg.steps):
                _train(ab, opt, rank, range(step, step + 1))
                phases.append(ab.phase.kind)
                if step == CUT - 1:
                    saved = copy.deepcopy(
                        dict(
                            ab=ab.state_dict(),
                            model=model.state_dict(),
                            opt=opt.state_dict(),
                            rng=torch.get_rng_state(),
                        )
                    )
            ab.finish()
        finally:
            sync.merge = real_merge
        whole = {k: v.clone() for k, v in model.state_dict().items()}
        grouped = {
            n for n, m in model.named_modules() if isinstance(m, torch.nn.Conv2d) and m.groups > 1
        }
        # resume: fresh objects, the checkpoint loaded, the rest of the run
        model2, opt2, ab2 = _build(arch, kwargs, cfg)
        ab2.load_state_dict(saved["ab"])
        model2.load_state_dict(saved["model"])
        opt2.load_state_dict(saved["opt"])
        torch.set_rng_state(saved["rng"])
        _train(ab2, opt2, rank, range(CUT, cfg.steps))
        ab2.finish()
        resumed = model2.state_dict()
        plain = ab2.full_rank_model()
        out[family] = dict(
            phases=phases,
            merges=merges,
            factorised=len(ab.layers),
            grouped=sorted(grouped),
            grouped_factorised=sorted(grouped & set(ab.layers)),
            bitwise=whole.keys() == resumed.keys()
            and all(torch.equal(whole[k], resumed[k]) for k in whole),
            plain_types=sorted({type(m).__name__ for m in plain.modules()}),
        )
    return out


@pytest.mark.multiprocess
def test_timm_families_through_every_phase_on_two_nodes():
    pytest.importorskip("timm")
    per_rank = spawn(_families, world=2, ranks_per_node=1)
    for family, r in per_rank[0].items():
        assert r["phases"] == ["warmup"] * 2 + ["ab"] * 3 + ["rebound"] + ["ab"] * 2, family
        assert r["factorised"] > 0, family
        assert len(r["merges"]) == 2, family  # the mid-run sync and the final one
        for m in r["merges"]:
            assert m["err"] <= 1e-4 * max(1.0, m["scale"]), (family, m)
            # one all-reduce carries A, B and the never-factorised state; on 2 ranks on 2
            # nodes a ring all-reduce sends its payload once
            assert m["payload"] == [m["expected"]] and m["wire"] == m["payload"], (family, m)
        assert r["bitwise"], f"{family}: the resumed run differs from the uninterrupted one"
        assert "LowRankLayer" not in r["plain_types"], family
        assert per_rank[1][family]["bitwise"], family
        assert not r["grouped_factorised"], family  # kept full rank
    # the depthwise (ConvNeXt) and grouped (RegNet) convolutions were there to keep
    for family in ("convnext", "regnet"):
        assert per_rank[0][family]["grouped"], family


# ---------------------------------------------------------------- the Trainer is this loop
BITS = ("method=ab", "checkpoint_every=0")


def _plain_loop(rank: int, world: int) -> dict:
    """abtrain's batches, model and AdamW, driven by a loop written against the API."""
    from abtrain.data.datasets import make_task
    from abtrain.data.loader import StepSampler
    from abtrain.method.abtraining import ABTraining

    torch.set_num_threads(1)  # as torchrun sets it: a matmul's sums in the same order
    cfg = tiny_config(*BITS)
    task = make_task(cfg)
    sampler = StepSampler(len(task), cfg.batch_size, rank, world, cfg.seed)
    model = models.build(cfg, task.classes, task.features)
    o = cfg.optim
    opt = torch.optim.AdamW(
        model.parameters(), lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay
    )
    ab = ABTraining(model, opt, cfg)
    torch.manual_seed(cfg.seed * 1000 + rank)
    batches = task.train_batches(sampler, 0, cfg.steps)
    for step in range(cfg.steps):
        net = ab.module(step)
        for g in opt.param_groups:
            g["lr"] = schedule.scheduled_lr(step, cfg) * ab.lr_factor(step)
        x, y = next(batches)
        loss = F.cross_entropy(net(x).float(), y, label_smoothing=o.label_smoothing)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        trainable = [p for p in model.parameters() if p.requires_grad]
        torch.nn.utils.clip_grad_norm_(trainable, o.max_grad_norm)
        opt.step()
    ab.finish()
    return {k: v.numpy().tobytes() for k, v in model.state_dict().items()}  # bits, by value


@pytest.mark.multiprocess
def test_a_plain_loop_on_the_api_gives_the_bits_of_abtrain_train(tmp_path):
    proc = launch(tmp_path, *BITS, nnodes=2, nproc=1)
    assert proc.returncode == 0, proc.stderr[-3000:]
    trained = torch.load(tmp_path / "model.pt", weights_only=True)
    mine = spawn(_plain_loop, world=2, ranks_per_node=1)[0]
    assert mine.keys() == trained.keys()
    differ = [k for k in mine if mine[k] != trained[k].numpy().tobytes()]
    assert not differ, f"differ from abtrain train: {differ}"


# ---------------------------------------------------------------- the example
def _readme_command() -> list[str]:
    """The README's command for the example, as a user pastes it."""
    import re
    import shlex

    line = re.search(
        r"`(torchrun [^`]*examples/ab_loop\.py[^`]*)`", (ROOT / "README.md").read_text()
    )
    assert line, "the README gives no torchrun command for examples/ab_loop.py"
    return shlex.split(line[1])


@pytest.mark.multiprocess
def test_the_readmes_example_command_runs_once_outside_the_repository(tmp_path):
    """Run once, as the README says, from a folder of the user's own with no params.yaml:
    a torchvision ResNet-18 (a model abtrain did not write) through every phase on the
    guidelines' schedule from steps= alone."""
    import torchvision

    mine = tmp_path / "my_project"
    mine.mkdir()
    (mine / "ab_loop.py").write_text((ROOT / "examples/ab_loop.py").read_text())
    cmd = _readme_command()
    assert cmd[0] == "torchrun" and "--standalone" in cmd, cmd  # one command, one machine
    script = cmd.index("examples/ab_loop.py")
    cmd = [sys.executable, "-m", "torch.distributed.run", *cmd[1:script], "ab_loop.py"]
    save = mine / "model.pt"
    proc = subprocess.run(
        [*cmd, "--steps=30", f"--save={save}"],
        cwd=mine,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert not (mine / "params.yaml").exists()
    text = proc.stdout
    # 30 steps: warm-up 6, then AB phases of 1 step, each synced and followed by a rebound
    # of 1 (the guidelines); the example prints every 10th step
    assert "step 0 (warmup)" in text and "step 10 (ab)" in text, text
    assert "inter-node" in text and "  sync:" in text and "  rebound:" in text, text
    # the merged model is a plain torchvision ResNet-18 again
    torchvision.models.resnet18(num_classes=10).load_state_dict(torch.load(save, weights_only=True))


# ---------------------------------------------------------------- a user's own model, by CLI
NET = """
from torch import nn


class Net(nn.Module):
    def __init__(self, num_classes, width):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, width), nn.GELU(), nn.Linear(width, width))
        self.out = nn.Linear(width, num_classes)

    def forward(self, x):
        return self.out(nn.functional.gelu(self.body(x)))


def build(num_classes, width=32):
    return Net(num_classes, width)
"""


@pytest.mark.multiprocess
def test_a_users_factory_model_trains_through_the_cli(tmp_path):
    (tmp_path / "my_net.py").write_text(NET)
    model = "model={name: python, factory: 'my_net:build', kwargs: {width: 48}, init: default}"
    out = tmp_path / "run"
    proc = launch(out, model, nnodes=2, nproc=1, env={"PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = summary(out)
    assert {n for f in s["factorizations"] for n in f["ranks"]} == {"body.2"}
    assert s["full_rank_layers"] == {
        "body.0": "first weight layer (default)",
        "out": "last weight layer (default)",
    }
    assert "body.2,Linear,48x48,48,48,48,1," in (out / "layers.csv").read_text()
