"""ViT-B/16 on one GPU: throughput of ddp and ab steps, peak memory, and the cost of a
factorisation and of a sync.

    python -m bench.gpu [--out bench/results/gpu.json] [--batch 256] [--steps 10]

The paper profile's model (224 px, bf16 autocast, AdamW, label smoothing, gradient
clipping) in a world of one process on NCCL, wrapped in DDP with abtrain's ledger hook as
the trainer does; the inputs are random images made on the GPU, so no input pipeline is
measured. The Trainer itself needs a prepared ImageNet and writes checkpoints, so the
pieces it calls (models, lowrank, sync, groups, ledger) are driven directly, in its order:
full-rank steps, factorise, AB steps with W's moments carried, sync, W = A·B. With one
process the sync's all-reduce moves nothing: its time is the local cost (flatten, a
one-rank all-reduce, unflatten, the merge's matmuls), not network time. Without a GPU it
says so, writes {"gpu": false, "reason": ...} and exits 0.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
import yaml

from abtrain import config, models
from abtrain.commands.localrun import free_port
from abtrain.distributed import groups
from abtrain.distributed.ledger import Ledger
from abtrain.files import write_record
from abtrain.method import lowrank, sync
from abtrain.models.init import ortho_sigma_
from abtrain.predict import footprint

PAPER = Path("profiles/paper.yaml")


def _timed(fn, device: torch.device) -> float:
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def _throughput(cfg, model, opt, ledger, group, x, y, steps: int) -> dict[str, Any]:
    """Steps as the trainer makes them, on a fresh DDP wrapper over the trainable params."""
    device = x.device
    ddp = torch.nn.parallel.DistributedDataParallel(
        model,
        device_ids=[device.index],
        process_group=group,
        init_sync=False,
        forward_sync_buffers=False,
        bucket_cap_mb=cfg.dist.bucket_cap_mb,
    )
    ddp.register_comm_hook(None, ledger.allreduce_hook(group))
    trainable = [p for p in model.parameters() if p.requires_grad]

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = ddp(x)
        loss = F.cross_entropy(logits.float(), y, label_smoothing=cfg.optim.label_smoothing)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, cfg.optim.max_grad_norm)
        opt.step()

    for _ in range(3):  # kernels chosen, buckets rebuilt, AdamW's state made
        step()
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    seconds = _timed(lambda: [step() for _ in range(steps)], device)
    inputs = x.nbytes + y.nbytes
    out = dict(
        images_per_s=steps * len(x) / seconds,
        step_s=seconds / steps,
        peak_memory_bytes=torch.cuda.max_memory_allocated(device),
        # between steps, inputs aside: parameters, gradients, DDP's buckets, AdamW's moments
        held_memory_bytes=torch.cuda.memory_allocated(device) - inputs,
    )
    ddp = None
    gc.collect()  # the wrapper's reducer must drop its autograd hooks before the next one
    return out


def measure(batch: int, steps: int) -> dict[str, Any]:
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    raw = yaml.safe_load(PAPER.read_text())["train"]
    cfg = config.from_dict(raw, ["method=ab", f"batch_size={batch}", "model.init=default"])
    size = cfg.data.image_size  # ViT-B/16's img_size too (profiles/paper.yaml)
    model = models.build(cfg, 1000).to(device)
    ortho_sigma_(model)  # the authors' init, on the GPU (SVDs on the CPU take minutes)
    layers = lowrank.convert(model, cfg.ab.full_rank_layers)
    ledger = Ledger(0, [0], device=device)
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=cfg.optim.lr,
        betas=tuple(cfg.optim.betas),
        weight_decay=cfg.optim.weight_decay,
    )
    x = torch.randn(batch, 3, size, size, device=device)
    y = torch.randint(0, 1000, (batch,), device=device)
    out: dict[str, Any] = dict(
        gpu=True,
        device=torch.cuda.get_device_name(device),
        torch=torch.__version__,
        cuda=torch.version.cuda,
        model=f"ViT-B/16, {size} px, {sum(p.numel() for p in model.parameters())} params",
        batch=batch,
        steps=steps,
        bf16=True,
        world_size=1,
        backend="nccl",
    )
    out["ddp"] = _throughput(cfg, model, opt, ledger, None, x, y, steps)

    # factorise every layer (SVD in float32 on the GPU); cutoff 0.15 keeps full rank here
    role = "a"
    svd = [_timed(lambda: sync.factorize_layers(layers, cfg.ab.sigma_cutoff, role, ledger), device)]
    svd += [
        _timed(lambda: sync.factorize_layers(layers, cfg.ab.sigma_cutoff, role, ledger), device)
    ]
    out["factorize"] = dict(
        layers=len(layers), seconds=svd[-1], first_seconds=svd[0], keep=1.0, role=role
    )
    ab = groups.ABGroups(
        roles=[([0], "a"), ([], "b")],  # two groups: the with_stale sync, not the single path
        role=role,
        group=dist.group.WORLD,
        a_ranks=[0],
        b_ranks=[],
        learners=None,
    )
    out["ab"] = dict(keep=1.0, role=role, **_throughput(cfg, model, opt, ledger, None, x, y, steps))

    moments = [
        opt.state[p][k]
        for p in sync.shared_params(model, layers)
        if p in opt.state
        for k in ("exp_avg", "exp_avg_sq")
    ]

    def one_sync() -> None:
        sync.average(model, layers, ab, "with_stale", ledger, moments)
        sync.merge(layers)

    out["sync"] = dict(
        seconds=statistics.median(_timed(one_sync, device) for _ in range(3)),
        mode="with_stale",
        note="world size 1: the local cost (flatten, a one-rank NCCL all-reduce, unflatten, "
        "W = A·B for every layer), not network time",
    )

    # AB at half the rank: the factors' old moments no longer fit, so they go (reset)
    with torch.no_grad():
        for layer in layers.values():
            rows, cols = layer.weight.shape[0], layer.weight[0].numel()
            a, b = lowrank.factorize(layer.weight, cfg.ab.sigma_cutoff, rank=min(rows, cols) // 2)
            opt.state.pop(layer.a, None)
            opt.state.pop(layer.b, None)
            layer.set_factors(a, b, role)
    out["ab_half"] = dict(
        keep=0.5, role=role, **_throughput(cfg, model, opt, ledger, None, x, y, steps)
    )
    for key, keep in (("ab", 1.0), ("ab_half", 0.5)):
        mem = footprint.footprint(cfg, nodes=2, ranks_per_node=1, classes=1000, keep=keep).memory
        out[key]["planner_held_memory_bytes"] = mem["ab"]["total"]
        if key == "ab":
            out["ddp"]["planner_held_memory_bytes"] = mem["full"]["total"]
    dist.destroy_process_group()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="bench/results/gpu.json")
    p.add_argument("--batch", type=int, default=256, help="images per step (the paper's 256)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per method")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        reason = "no CUDA GPU visible to torch (torch.cuda.is_available() is False)"
        print(f"bench.gpu: {reason}; nothing measured", file=sys.stderr)
        result: dict[str, Any] = dict(gpu=False, reason=reason)
    else:
        result = measure(args.batch, args.steps)
        for key in ("ddp", "ab", "ab_half"):
            r = result[key]
            print(
                f"{key:<8}{r['images_per_s']:>9.1f} images/s  peak {r['peak_memory_bytes'] / 1e9:.2f} GB"
                f"  held {r['held_memory_bytes'] / 1e9:.2f} GB"
                f" (planner {r['planner_held_memory_bytes'] / 1e9:.2f} GB)"
            )
        print(
            f"factorise {result['factorize']['layers']} layers: "
            f"{result['factorize']['seconds']:.3f} s; sync: {result['sync']['seconds']:.3f} s "
            "(world size 1: local cost only)"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_record(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
