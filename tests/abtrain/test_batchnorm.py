"""Batch statistics over a group: the same as one process with the whole batch, counted by
the ledger, and identical running statistics on every rank of a real ResNet-50 run."""

import subprocess
import sys

import pytest
import torch
from torch import nn

from abtrain.distributed import batchnorm
from abtrain.distributed.ledger import Ledger
from abtrain.predict import traffic
from abtrain.run import checkpointer
from tests.abtrain.test_data import write_tree
from tests.helpers import PARAMS, ROOT, launch, spawn, summary, tiny_config

pytestmark = pytest.mark.multiprocess  # spawned gloo ranks, launched runs

BATCH = torch.Generator().manual_seed(0)
X = torch.randn(8, 3, 5, 5, generator=BATCH) * 2 + 1
W = torch.randn(8, 3, 5, 5, generator=BATCH)  # weights of a loss, so gradients differ


def one_step(bn: nn.BatchNorm2d, x: torch.Tensor, w: torch.Tensor) -> dict:
    x = x.clone().requires_grad_()
    (bn(x) * w).sum().backward()
    return dict(
        x_grad=x.grad,
        weight_grad=bn.weight.grad,
        running_mean=bn.running_mean.clone(),
        running_var=bn.running_var.clone(),
    )


def synced_half(rank, world, gather=False):
    ledger = Ledger(rank, [0, 1], keep_rows=True)
    bn = batchnorm.SyncedBatchNorm2d(3)
    bn.ledger, bn.gather = ledger, gather
    half = slice(4 * rank, 4 * rank + 4)
    # plain lists: tensors would travel back as shared memory of an exiting process
    out = {k: v.tolist() for k, v in one_step(bn, X[half], W[half]).items()}
    out["ops"] = [(r["op"], r["payload_bytes"]) for r in ledger.rows]
    return out


def gathered_half(rank, world):
    return synced_half(rank, world, gather=True)


@pytest.mark.parametrize(
    "fn, ops",
    [  # (Σx, Σx², n): 2·3 + 1 floats; the authors' (torch's) collectives send 2·3 back
        (synced_half, [("all_reduce", 28), ("all_reduce", 28)]),
        (gathered_half, [("all_gather", 28), ("all_reduce", 24)]),
    ],
)
def test_two_ranks_with_half_the_batch_each_equal_one_process_with_all_of_it(fn, ops):
    single = one_step(nn.BatchNorm2d(3), X, W)
    ranks = spawn(fn, world=2, ranks_per_node=1)
    ranks = [{k: v if k == "ops" else torch.tensor(v) for k, v in r.items()} for r in ranks]
    for rank, got in enumerate(ranks):
        half = slice(4 * rank, 4 * rank + 4)
        torch.testing.assert_close(got["x_grad"], single["x_grad"][half], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(got["running_mean"], single["running_mean"])
        torch.testing.assert_close(got["running_var"], single["running_var"])
        assert got["ops"] == ops
    # DDP averages the weight gradients of the ranks: the single process's gradient
    mean_grad = (ranks[0]["weight_grad"] + ranks[1]["weight_grad"]) / 2
    torch.testing.assert_close(2 * mean_grad, single["weight_grad"], atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    write_tree(root / "tree", per_class=8, size=32)
    return root


def resnet_overrides(out, images, sync: str, method: str = "ddp") -> list[str]:
    return [
        f"method={method}",
        "steps=3",
        "ab.warmup_steps=1",  # AB: one full-rank step, one AB step, one rebound
        "ab.ab_steps=1",
        "ab.rebound_steps=1",
        "ab.phase_rule=algorithm1",
        "batch_size=4",
        "eval_every=3",
        "checkpoint_every=1",
        "keep_checkpoints=10",
        # AB: ortho_sigma keeps every rank (σ all 1), as the planner's keep=1.0 assumes
        f"model={{name: timm, arch: resnet50, kwargs: {{zero_init_last: false}}, "
        f"init: {'default' if method == 'ddp' else 'ortho_sigma'}}}",
        f"data={{name: imagefolder, source: {images / 'tree'}, sha256: null, "
        f"prepared: {out / 'prepared'}, train_per_class: 0, val_per_class: 0, real_labels: null, "
        "image_size: 32, augment: true, workers: 0}",
        f"dist.sync_batchnorm={sync}",
    ]


@pytest.mark.parametrize("sync, method", [("group", "ddp"), ("local", "ddp"), ("world", "ab")])
def test_resnet50_ranks_hold_identical_batchnorm_statistics_after_every_step(
    tmp_path, images, sync, method
):
    """`world`, the authors' SyncBatchNorm, in an AB run: the statistics span both nodes in
    the AB step too, where each node trains its own factor, and the ledger and the planner
    count torch's all-gather and all-reduce exactly."""
    overrides = resnet_overrides(tmp_path, images, sync, method)
    prep = [sys.executable, "-m", "abtrain", "prepare", "--config", str(PARAMS)]
    assert subprocess.run([*prep, "--set", overrides[-2]], cwd=ROOT).returncode == 0
    proc = launch(tmp_path / "run", *overrides, nnodes=2, nproc=1)
    assert proc.returncode == 0, proc.stderr[-3000:]
    root = tmp_path / "run" / "checkpoints"
    for step in (1, 2, 3):
        own = [checkpointer.load(root, step, r)[0]["buffers"] for r in range(2)]
        stats = [k for k in own[0] if k.endswith(("running_mean", "running_var"))]
        assert len(stats) == 2 * 53  # every BatchNorm of ResNet-50
        same = all(torch.equal(own[0][k], own[1][k]) for k in stats)
        assert same == (sync != "local"), step  # per-rank statistics differ without it
    # the planner counts the synced statistics' traffic exactly
    predicted = traffic.estimate(tiny_config(*overrides), nodes=2, ranks_per_node=1, classes=2)
    measured = summary(tmp_path / "run")["traffic"]["inter_node_bytes"]
    assert predicted.inter_bytes == pytest.approx(measured, rel=1e-9), tmp_path


def test_conversion_keeps_the_parameters_an_optimizer_made_before_holds():
    """A user's loop makes its optimizer before ABTraining converts the batch norms: the
    optimizer must still hold the model's parameters, or batch norm would never train."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    before = list(model.parameters())
    opt = torch.optim.AdamW(model.parameters())
    assert batchnorm.convert(model) == 1
    assert type(model[1]) is batchnorm.SyncedBatchNorm2d
    assert all(a is b for a, b in zip(model.parameters(), before, strict=True))
    assert all(p is q for p, q in zip(opt.param_groups[0]["params"], before, strict=True))
