"""AB training in your own loop: a torchvision ResNet-18, your optimizer, four abtrain calls.

  torchrun --nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:29400 \
      examples/ab_loop.py --steps 60     (the data is a stand-in: put your loader there)
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision

import abtrain

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--lr", type=float, default=1e-3)
parser.add_argument("--save", help="where to save the merged model's state dict")
args = parser.parse_args()

dist.init_process_group("gloo")  # "nccl" on GPUs (then move the model and data there)
rank = dist.get_rank()
# The method's settings (method, ab.*, powersgd.*, dist.*) from params.yaml, its schedule
# cut to this run: warm-up, then cycles of 15 AB steps and 5 full-rank rebound steps.
cfg = abtrain.load_config(
    "params.yaml",
    [f"steps={args.steps}", "ab.warmup_steps=20", "ab.ab_steps=15", "ab.rebound_steps=5"],
)
torch.manual_seed(0)  # every rank builds the same model, as for DDP
model = torchvision.models.resnet18(num_classes=10)
opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
ab = abtrain.ABTraining(model, opt, cfg)  # factorisable layers become A·B-capable, in place

templates = torch.randn(10, 3, 32, 32, generator=torch.Generator().manual_seed(1))
data = torch.Generator().manual_seed(100 + rank)  # each rank its own shard
for step in range(cfg.steps):
    net = ab.module(step)  # warm-up, AB phase in this rank's group, sync, rebound
    for group in opt.param_groups:  # your schedule, times the rebound after each change
        group["lr"] = args.lr * ab.lr_factor(step)
    y = torch.randint(0, 10, (32,), generator=data)
    x = templates[y] + torch.randn(32, 3, 32, 32, generator=data)
    loss = F.cross_entropy(net(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if rank == 0 and step % 10 == 0:
        print(f"step {step} ({ab.phase.kind}): loss {loss.item():.3f}", flush=True)

ab.finish()  # A and B averaged over the world, W = A·B: one full-rank model again
model = ab.full_rank_model()  # a plain torchvision ResNet-18, its merged weights in place
sent = ab.traffic()
if rank == 0:
    print(f"inter-node {sent['inter_node_bytes'] / 1e6:.1f} MB per rank; by phase:", flush=True)
    for phase, b in sent["by_phase"].items():
        print(f"  {phase}: {b['inter'] / 1e6:.2f} MB", flush=True)
    if args.save:
        torch.save(model.state_dict(), args.save)
dist.destroy_process_group()
