"""The API's edges, met as a researcher adding AB to a script of their own meets them: no
config file, a weight tied by reading it, steps out of order, a frozen layer, traffic asked
on one rank, a timm model named by its architecture alone, arguments timm refuses."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from abtrain.__main__ import main
from abtrain.commands import preflight
from abtrain.config import ConfigError, MethodConfig
from abtrain.method import guidelines, lowrank
from abtrain.method.guidelines import load_config as load
from tests.abtrain.test_data import write_tree
from tests.helpers import PARAMS, ROOT, TINY, spawn, summary
from tests.helpers import launch as launch_run


# ---------------------------------------------------------------- no config file
def test_steps_alone_give_the_papers_guidelines_and_each_yields_to_a_keyword():
    cfg = guidelines.method_config(steps=600)
    ab = cfg.ab
    assert (ab.warmup_steps, ab.ab_steps, ab.rebound_steps, ab.lr_rebound_steps) == (120, 20, 5, 10)
    assert (ab.sigma_cutoff, ab.sync_mode, ab.group_size) == (0.15, "with_stale", None)
    assert cfg.method == "ab" and cfg.steps == 600
    # the rebounds follow the AB phase a user sets
    mine = guidelines.method_config(steps=600, ab_steps=40, sigma_cutoff=0.4)
    assert (mine.ab.ab_steps, mine.ab.rebound_steps, mine.ab.lr_rebound_steps) == (40, 10, 20)
    assert mine.ab.sigma_cutoff == 0.4 and mine.ab.warmup_steps == 120
    with pytest.raises(ConfigError, match=r"ab\.sigma_cutof: .*did you mean sigma_cutoff"):
        guidelines.method_config(steps=600, sigma_cutof=0.4)
    with pytest.raises(ConfigError, match="steps: 0 is not a positive"):
        guidelines.method_config(steps=0)


def test_a_config_built_by_hand_names_what_it_lacks_and_where_the_guidelines_are():
    import abtrain

    with pytest.raises(ConfigError) as err:
        abtrain.Config(method="ab", steps=30)
    text = str(err.value)
    assert "ab: Field required" in text and "abtrain.method_config(steps=N" in text
    assert "ValidationError" not in text and "pydantic" not in text


def test_a_yaml_of_the_methods_keys_alone_is_read_from_anywhere(tmp_path, monkeypatch):
    (tmp_path / "ab.yaml").write_text("method: ab\nsteps: 300\nab:\n  sigma_cutoff: 0.3\n")
    monkeypatch.chdir(tmp_path)  # not the repository: no params.yaml here
    cfg = load("ab.yaml", ["ab.group_size=1", "powersgd.rank=2"])
    assert isinstance(cfg, MethodConfig) and cfg.steps == 300
    assert (cfg.ab.sigma_cutoff, cfg.ab.group_size, cfg.powersgd.rank) == (0.3, 1, 2)
    assert cfg.ab.warmup_steps == 60  # the rest: the guidelines
    (tmp_path / "bad.yaml").write_text("steps: 300\nab: {sigma_cutof: 0.3}\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: ab\.sigma_cutof"):
        load("bad.yaml")
    # the pipeline's file is still read whole, every key required
    assert type(load(PARAMS)).__name__ == "Config"


# ---------------------------------------------------------------- one loop, every edge
class TiedAutoencoder(nn.Module):
    """A decoder tied to its encoder by reading the encoder's weight in the forward (the
    usual tied autoencoder), a frozen layer, and plain layers around them."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(16, 32)
        self.enc = nn.Linear(32, 8)
        self.mid = nn.Linear(32, 32)
        self.frozen = nn.Linear(32, 32)
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.stem(x))
        h = F.linear(self.enc(h), self.enc.weight.t())  # the decoder: W read directly
        return self.head(torch.relu(self.frozen(torch.relu(self.mid(h)))))


def _loop_with_every_edge(rank: int, world: int) -> dict:
    from abtrain.method.abtraining import ABTraining

    torch.manual_seed(0)
    model = TiedAutoencoder()
    model.frozen.weight.requires_grad_(False)  # a fine-tuner's frozen layer: not in opt
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ab = ABTraining(model, opt, steps=30)  # nothing else
    out: dict = dict(survey={c.name: c.reason for c in ab.survey}, refused=[], untied=[])
    probe = torch.randn(4, 32, generator=torch.Generator().manual_seed(5))
    data = torch.Generator().manual_seed(rank)
    enc_at_ab_start = None
    for step in range(30):
        net = ab.module(step)
        if step == 11:  # out of order: a jump, a step back; nothing may change
            before = (ab.phase, ab.ledger.step, len(ab.factorizations))
            for wrong in (13, 9):
                try:
                    ab.module(wrong)
                except ValueError as err:
                    out["refused"].append(str(err))
            out["unchanged"] = before == (ab.phase, ab.ledger.step, len(ab.factorizations))
            net = ab.module(11)  # the same step again is fine (micro-batches)
        if step == 20 and rank == 0:
            out["alone"] = ab.traffic()  # rank 0 alone: no collective to wait on
        for g in opt.param_groups:
            g["lr"] = 1e-2 * ab.lr_factor(step)
        x = torch.randn(8, 16, generator=data)
        loss = F.mse_loss(net(x), x[:, :4])
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():  # what the encoder computes with vs the W the decoder reads
            gap = (model.enc(probe) - F.linear(probe, model.enc.weight, model.enc.bias)).abs()
        if gap.max() > 0:
            out["untied"].append((step, gap.max().item()))
        if ab.phase.kind == "ab" and enc_at_ab_start is None:
            enc_at_ab_start = model.enc.weight.detach().clone()
    out["enc_trained_in_ab"] = not torch.equal(enc_at_ab_start, model.enc.weight)
    out["syncs"] = len(ab.factorizations)
    exact = ab.traffic(exact=True)
    out["exact"], out["view"] = exact, ab.traffic()
    ab.finish()
    try:
        ab.module(29)
    except ValueError as err:
        out["after_finish"] = str(err)
    return out


@pytest.mark.multiprocess
def test_a_loop_on_a_tied_model_with_a_frozen_layer_meets_every_edge_and_is_told():
    ranks = spawn(_loop_with_every_edge, world=2, ranks_per_node=1)
    r = ranks[0]
    assert r["survey"] == {
        "stem": "first weight layer (default)",
        "enc": "weight read directly by TiedAutoencoder.forward",
        "mid": "",
        "frozen": "weight not trained (frozen: requires_grad off, or not in the optimizer)",
        "head": "last weight layer (default)",
    }
    # tied at every step, and the tied W is trained in AB phases too
    assert r["untied"] == [] and r["enc_trained_in_ab"]
    assert r["syncs"] >= 2  # 30 steps: warm-up 6, then AB phases of 1 and rebounds of 1
    assert r["unchanged"] and len(r["refused"]) == 2
    assert "module(13) after module(11)" in r["refused"][0] and "next is 12" in r["refused"][0]
    assert "module(9) after module(11)" in r["refused"][1]
    assert "after finish()" in r["after_finish"]
    assert r["alone"]["inter_node_bytes"] > 0
    # the view one rank has is the ranks' exact sum here (mirrored groups)
    assert r["view"]["inter_node_bytes"] == pytest.approx(r["exact"]["inter_node_bytes"])
    assert r["view"]["by_phase"].keys() == r["exact"]["by_phase"].keys()


def test_the_api_says_why_a_model_has_nothing_to_factorise_without_sending_to_the_cli():
    class OnlyTied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.enc = nn.Linear(4, 4)

        def forward(self, x):
            return F.linear(self.enc(x), self.enc.weight.t())

    choices = lowrank.survey(OnlyTied(), [])
    why = lowrank.why_kept(choices)
    assert why == "enc: weight read directly by OnlyTied.forward"


def test_reads_that_only_describe_a_weight_or_reach_it_by_index_are_told_apart():
    class Reader(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
            self.out = nn.Linear(4, 4)

        def forward(self, x):
            x = x.to(self.out.weight.dtype)  # describes W: no use of its values
            return self._decode(self.out(self.blocks[1](self.blocks[0](x))))

        def _decode(self, h):  # a method forward calls: on the model's code path
            return h @ self.blocks[1].weight

    reasons = {c.name: c.reason for c in lowrank.survey(Reader(), [])}
    assert reasons == {
        "blocks.0": "",
        "blocks.1": "weight read directly by Reader._decode",
        "out": "",
    }


# ---------------------------------------------------------------- timm by name
def test_a_distilled_deits_two_classifier_heads_are_both_kept_by_default():
    import timm

    with torch.device("meta"):
        deit = timm.create_model(
            "deit_tiny_distilled_patch16_224", img_size=32, patch_size=8, depth=2, num_classes=10
        )
    kept = lowrank.kept_full_rank(lowrank.survey(deit, None))
    assert set(kept) == {"patch_embed.proj", "head", "head_dist"}


def test_arguments_timm_refuses_with_a_keyerror_are_named_by_check_and_before_launch(capsys):
    bad = "model={name: timm, arch: mixer_s16_224, kwargs: {patch_size: 8, img_size: 32}}"
    args = ["--config", str(PARAMS)]
    for o in (*TINY, bad):
        args += ["--set", o]
    assert main(["check", *args]) == 2
    err = capsys.readouterr().err.strip()
    want = "model.kwargs: timm's mixer_s16_224 refused its arguments: KeyError: 'patch_size'"
    assert err.endswith(want) and len(err.splitlines()) == 1, err
    # train: refused by the launcher before any torchrun starts
    refused = preflight.refusal(["train", *args, "--out", "unused"], 2, 1)
    assert refused is not None and refused.endswith(want), refused


@pytest.mark.multiprocess
def test_a_timm_model_named_by_its_architecture_alone_trains(tmp_path):
    write_tree(tmp_path / "tree", per_class=8, size=32)
    out = tmp_path / "run"
    data = (
        f"data={{name: imagefolder, source: {tmp_path / 'tree'}, sha256: null, "
        f"prepared: {tmp_path / 'prepared'}, train_per_class: 0, val_per_class: 0, "
        "real_labels: null, image_size: 32, augment: false, workers: 0}"
    )
    prep = [sys.executable, "-m", "abtrain", "prepare", "--config", str(PARAMS), "--set", data]
    assert subprocess.run(prep, cwd=ROOT).returncode == 0
    sets = ("model={name: timm, arch: resnet18}", data, "steps=12", "batch_size=4")
    sets += ("eval_every=12", "checkpoint_every=0", "ab.warmup_steps=4", "ab.ab_steps=4")
    proc = launch_run(out, *sets, "ab.rebound_steps=1", nnodes=2, nproc=1)
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = summary(out)
    assert s["steps"] == 12 and len(s["factorizations"]) == 2
    assert s["full_rank_layers"]["conv1"] == "first weight layer (default)"
    assert s["full_rank_layers"]["fc"] == "last weight layer (default)"


# ---------------------------------------------------------------- no launcher
def test_train_started_alone_without_torchrun_trains_as_a_world_of_one(tmp_path):
    """`python -m abtrain train` typed on a laptop, no torchrun and no MASTER_ADDR: a DDP
    run of one process, not a traceback about env:// rendezvous."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_ENV}
    sets = [a for s in (*TINY, "method=ddp", "steps=12") for a in ("--set", s)]
    cmd = [sys.executable, "-m", "abtrain", "train", "--config", str(PARAMS), *sets]
    proc = subprocess.run(
        [*cmd, "--out", str(tmp_path / "run")], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = summary(tmp_path / "run")
    assert s["steps"] == 12 and s["world_size"] == 1


LAUNCH_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
