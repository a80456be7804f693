"""Users' own loops over `abtrain.ABTraining`, run by tests/abtrain/test_user_loops.py under
torchrun on 2 ranks (each rank a node of its own). Each case writes what it saw to
OUT/CASE-rank-R.json; the test reads and judges it. Not a test file itself."""

import json
import math
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import abtrain

OUT = Path(sys.argv[1])
STEPS = 24
SCHEDULE = dict(warmup_steps=4, ab_steps=6, rebound_steps=2, lr_rebound_steps=3)


def make(model_cls, **kw):
    torch.manual_seed(0)  # every rank the same model, as for DDP
    model = model_cls()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    settings = {**SCHEDULE, "group_size": 1, "full_rank_layers": [], "sigma_cutoff": 0.05, **kw}
    ab = abtrain.ABTraining(model, opt, steps=STEPS, node=dist.get_rank(), **settings)
    return model, opt, ab


def batch(step, features=16):
    g = torch.Generator().manual_seed(1000 * step + dist.get_rank())
    return torch.randn(8, features, generator=g), torch.randint(0, 4, (8,), generator=g)


# ---------------------------------------------------------------- outside reads
def helper(x, layer):
    """A module-level helper handed the layer: it reads the weight."""
    return F.linear(x, layer.weight)


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(16, 16, bias=False)

    def attend(self, z):
        """A method of the layer's parent module, called from outside its forward."""
        return F.linear(z, self.enc.weight)


class Reads(nn.Module):
    """A factorised `body.enc` whose weight four paths read, none of which the survey can
    see: an alias, a helper, a submodule's own method, getattr by name."""

    def __init__(self, path):
        super().__init__()
        self.path = path
        self.body = Encoder()
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        h = torch.relu(self.body.enc(x))
        if self.path == "alias":
            enc = self.body.enc
            h = h + F.linear(x, enc.weight)
        elif self.path == "helper":
            h = h + helper(x, self.body.enc)
        elif self.path == "method":
            h = h + self.body.attend(x)
        elif self.path == "getattr":
            h = h + F.linear(x, getattr(self.body, "en" + "c").weight)
        return self.head(h)


def outside_reads(path):
    from abtrain.method import schedule

    model, opt, ab = make(lambda: Reads(path))
    layer = model.body.enc
    kept = {c.name: c.reason for c in ab.survey if not c.factorised}
    seen = dict(factorised=layer in ab.layers.values(), kept=kept.get("body.enc"))
    for step in range(STEPS):
        net = ab.module(step)
        x, y = batch(step)
        loss = F.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if not seen["factorised"] or ab.phase.kind != "ab":
            continue
        trained = layer.a if ab.role == "a" else layer.b
        if "first" not in seen:  # the phase's first step, after its update
            with torch.no_grad():
                seen["first"] = layer.weight.clone()
            # the read path's own gradient reaches the trained factor
            read = torch.autograd.grad(F.linear(x, layer.weight).sum(), trained)[0]
            seen["read_grad"] = read.abs().sum().item()
        if schedule.phase_at(step + 1, ab.cfg).kind != "ab":  # the phase's last step
            with torch.no_grad():
                product = (layer.left() @ layer.right()).reshape(layer.w.shape)
                seen["served_vs_product"] = (layer.weight - product).abs().max().item()
                seen["moved"] = (layer.weight - seen.pop("first")).abs().max().item()
                seen["stale_w_vs_product"] = (layer.w - product).abs().max().item()
            break
    ab.finish()  # a sync ends the phase it stands in
    seen.pop("first", None)
    return seen


# ---------------------------------------------------------------- kept graphs
class Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 24)
        self.b = nn.Linear(24, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def kept_losses():
    model, opt, ab = make(Two, sigma_cutoff=0.3)
    history, ranks, spiked = [], [], False
    for step in range(STEPS):
        net = ab.module(step)
        if ab.phase.kind == "rebound" and not spiked:
            # one direction made to dominate every W (alike on both ranks): the next
            # factorisation keeps rank 1, a change of shape from the first one's
            with torch.no_grad():
                for layer in ab.layers.values():
                    w = layer.w
                    w += 10 * w.norm() * torch.outer(torch.ones(w.shape[0]), torch.ones(w.shape[1]))
            spiked = True
        x, y = batch(step)
        loss = F.cross_entropy(net(x), y)
        history.append(loss)  # the graph stays alive
        opt.zero_grad()
        loss.backward()
        opt.step()
    ranks = [f["ranks"] for f in ab.factorizations]
    ab.finish()
    return dict(
        factorizations=len(ranks),
        ranks=ranks,
        losses=[h.item() for h in history],
    )


# ---------------------------------------------------------------- guards
def guards():
    out = {}
    model, opt, ab = make(Two)
    try:
        ab.full_rank_model()
        out["full_rank_model_first"] = "accepted"
    except RuntimeError as err:
        out["full_rank_model_first"] = str(err)
    try:
        ab.module(10)
        out["first_module_10"] = "accepted"
    except ValueError as err:
        out["first_module_10"] = str(err)
    for step in range(8):  # into the first AB phase
        net = ab.module(step)
        x, y = batch(step)
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        opt.step()
    state = ab.state_dict()
    model2, opt2, ab2 = make(Two)
    ab2.load_state_dict(state)
    ab2.module(8)  # continues: the state was loaded
    out["resumed_at_8"] = ab2.phase.kind
    ab.finish()
    ab2.finish()
    return out


# ---------------------------------------------------------------- LR schedulers
def chainable_scheduler():
    model, opt, ab = make(Two)
    twin = torch.optim.AdamW([nn.Parameter(torch.zeros(1))], lr=1e-2)
    plain = torch.optim.lr_scheduler.CosineAnnealingLR(twin, T_max=STEPS)  # no rebound
    sched = ab.rebound(torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS))
    used, wanted = [], []
    for step in range(STEPS):
        net = ab.module(step)
        used.append(opt.param_groups[0]["lr"])
        wanted.append(twin.param_groups[0]["lr"] * ab.lr_factor(step))
        x, y = batch(step)
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        opt.step()
        twin.step()
        sched.step()
        plain.step()
    # the naive way, for the record: the factor multiplied in after a chainable scheduler
    model3, opt3, ab3 = make(Two)
    naive_sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt3, T_max=STEPS)
    naive = []
    for step in range(STEPS):
        ab3.module(step)
        for g in opt3.param_groups:
            g["lr"] *= ab3.lr_factor(step)
        naive.append(opt3.param_groups[0]["lr"])
        opt3.step()
        naive_sched.step()
    ab.finish()
    ab3.finish()
    return dict(used=used, wanted=wanted, naive=naive)


# ---------------------------------------------------------------- DDP's own arguments
class Unused(nn.Module):
    """A layer no step uses: DDP must be told (find_unused_parameters)."""

    def __init__(self):
        super().__init__()
        self.used = Two()
        self.spare = nn.Linear(16, 16)

    def forward(self, x):
        return self.used(x)


def unused_layer():
    out = {}
    try:
        make(Unused, ddp_options={"process_group": None})
        out["refused"] = "accepted"
    except abtrain.ConfigError as err:
        out["refused"] = str(err)
    model, opt, ab = make(Unused, ddp_options={"find_unused_parameters": True})
    for step in range(STEPS):
        net = ab.module(step)
        x, y = batch(step)
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        opt.step()
    out["factorizations"] = len(ab.factorizations)
    ab.finish()
    return out


CASES = {
    **{
        f"reads-{p}": (lambda p=p: outside_reads(p))
        for p in ("alias", "helper", "method", "getattr")
    },
    "kept-losses": kept_losses,
    "guards": guards,
    "scheduler": chainable_scheduler,
    "unused-layer": unused_layer,
}

dist.init_process_group("gloo")
torch.set_num_threads(1)
for name, case in CASES.items():
    try:
        result = case()
    except Exception:  # the test shows it
        result = dict(error=traceback.format_exc())
    result = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in result.items()}
    (OUT / f"{name}-rank-{dist.get_rank()}.json").write_text(json.dumps(result))
    dist.barrier()
dist.destroy_process_group()
