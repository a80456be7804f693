"""AB training in your own loop: a torchvision ResNet-18, your optimizer, four abtrain calls.

  torchrun --standalone --nproc-per-node=2 examples/ab_loop.py --steps 120

No config file: `steps=` alone gives the paper's guideline schedule (warm-up 20% of the
steps, AB phases 3.33%, rebounds a quarter and half of one). The data is a stand-in: put
your loader there.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision

import abtrain

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=120)
parser.add_argument("--lr", type=float, default=1e-3)
parser.add_argument("--save", help="where to save the merged model's state dict")
args = parser.parse_args()

dist.init_process_group("gloo")  # "nccl" on GPUs (then move the model and data there)
rank = dist.get_rank()
torch.manual_seed(0)  # every rank builds the same model, as for DDP
model = torchvision.models.resnet18(num_classes=10)
opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
# A/B groups are one node each; with every rank on this one machine, each rank stands for
# a node of its own (on a cluster, leave node= out: torchrun's node rank is used)
one_machine = int(os.environ["LOCAL_WORLD_SIZE"]) == dist.get_world_size()
ab = abtrain.ABTraining(model, opt, steps=args.steps, node=rank if one_machine else None)

templates = torch.randn(10, 3, 32, 32, generator=torch.Generator().manual_seed(1))
data = torch.Generator().manual_seed(100 + rank)  # each rank its own shard
for step in range(args.steps):
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
if rank == 0:
    sent = ab.traffic()  # this rank's ledger alone: no other rank need ask
    print(f"inter-node {sent['inter_node_bytes'] / 1e6:.1f} MB per rank; by phase:", flush=True)
    for phase, b in sent["by_phase"].items():
        print(f"  {phase}: {b['inter'] / 1e6:.2f} MB", flush=True)
    if args.save:
        torch.save(model.state_dict(), args.save)
dist.destroy_process_group()
