"""Every layer a real model has: which ones AB factorises, which it keeps full rank and why
(lowrank.survey), that a factorised layer computes what the original did, and the
`check --layers` table and the refusal of a model with nothing to factorise."""

from __future__ import annotations

import copy
import csv
import io

import pytest
import timm
import torch
from torch import nn
from torch.nn.utils import parametrizations

from abtrain.__main__ import main
from abtrain.commands import localrun, preflight
from abtrain.commands.preflight import check_model
from abtrain.config import ConfigError
from abtrain.method import lowrank
from abtrain.run import results
from tests.helpers import PARAMS, TINY, tiny_config


def reasons(model: nn.Module, full_rank_layers: list[str] | None = None) -> dict[str, str]:
    return {c.name: c.reason for c in lowrank.survey(model, full_rank_layers)}


def factorised(model: nn.Module, full_rank_layers: list[str] | None = None) -> list[str]:
    return [c.name for c in lowrank.survey(model, full_rank_layers) if c.factorised]


# ---------------------------------------------------------------- the rules
def test_linear_and_conv2d_are_factorised_and_the_first_and_last_kept_by_default():
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3),
        nn.BatchNorm2d(8),  # a 1-D weight: not a weight layer
        nn.Conv2d(8, 8, (1, 5), stride=2),
        nn.Flatten(),
        nn.Linear(8, 16),
        nn.LayerNorm(16),
        nn.Linear(16, 4),
    )
    assert reasons(model) == {
        "0": "first weight layer (default)",
        "2": "",
        "4": "",
        "6": "last weight layer (default)",
    }
    choice = {c.name: c for c in lowrank.survey(model, None)}["2"]
    assert (choice.kind, choice.shape, choice.rows, choice.cols) == ("Conv2d", (8, 8, 1, 5), 8, 40)
    assert choice.full_rank == 8 and choice.params == 320
    assert factorised(model, []) == ["0", "2", "4", "6"]


def test_other_layers_with_a_weight_matrix_are_listed_as_kept():
    model = nn.ModuleDict(
        dict(
            emb=nn.Embedding(10, 4),
            c1=nn.Conv1d(4, 4, 3),
            c3=nn.Conv3d(4, 4, 3),
            t2=nn.ConvTranspose2d(4, 4, 3),
            fc=nn.Linear(4, 4),
        )
    )
    assert reasons(model, []) == {
        "emb": "not a Linear/Conv2d",
        "c1": "not a Linear/Conv2d",
        "c3": "not a Linear/Conv2d",
        "t2": "not a Linear/Conv2d",
        "fc": "",
    }


def test_grouped_and_depthwise_convolutions_are_kept():
    model = nn.Sequential(
        nn.Conv2d(8, 8, 3, groups=8),
        nn.Conv2d(8, 16, 3, groups=8),  # depthwise with a channel multiplier of 2
        nn.Conv2d(16, 16, 3, groups=4),
        nn.Conv2d(16, 16, 1),
    )
    assert reasons(model, []) == {
        "0": "depthwise convolution",
        "1": "depthwise convolution",
        "2": "grouped convolution (groups=4)",
        "3": "",
    }


def test_a_subclass_with_its_own_forward_is_kept_one_without_is_factorised():
    from timm.layers import Conv2dSame, StdConv2d

    class Scaled(nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    class Named(nn.Linear):  # as MultiheadAttention's NonDynamicallyQuantizableLinear
        pass

    model = nn.Sequential(
        Conv2dSame(3, 4, 3, stride=2), StdConv2d(4, 4, 3), Scaled(4, 4), Named(4, 4)
    )
    assert reasons(model, []) == {
        "0": "own forward (Conv2dSame)",
        "1": "own forward (StdConv2d)",
        "2": "own forward (Scaled)",
        "3": "",
    }
    layers = lowrank.convert(model, [])
    assert list(layers) == ["3"] and type(model[0]) is Conv2dSame


class Tied(nn.Module):
    """A language-model head sharing the embedding's weight, and two projections sharing
    one weight, and one Linear registered under two names."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 6)
        self.up = nn.Linear(6, 6)
        self.down = nn.Linear(6, 6)
        self.down.weight = self.up.weight
        self.mid = nn.Linear(6, 6)
        self.again = self.mid
        self.free = nn.Linear(6, 6)
        self.head = nn.Linear(6, 10, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        x = self.emb(ids)
        return self.head(self.free(self.again(self.mid(self.down(self.up(x))))))


def test_tied_weights_are_kept_naming_who_shares_them():
    model = Tied()
    assert reasons(model, []) == {
        "emb": "not a Linear/Conv2d",
        "up": "weight shared with down.weight",
        "down": "weight shared with up.weight",
        "mid": "weight shared with again.weight",
        "again": "weight shared with mid.weight",
        "free": "",
        "head": "weight shared with emb.weight",
    }
    ids = torch.randint(0, 10, (2, 3))
    y = model(ids)
    assert list(lowrank.convert(model, None)) == []  # "free" is the first and the last
    assert list(lowrank.convert(model, [])) == ["free"]
    assert model.head.weight is model.emb.weight and model.down.weight is model.up.weight
    assert model.again is model.mid
    torch.testing.assert_close(model(ids), y)


def test_a_lazy_layer_is_kept_until_materialised():
    model = nn.Sequential(nn.LazyLinear(8), nn.LazyConv2d(4, 3), nn.Linear(8, 8))
    choices = {c.name: c for c in lowrank.survey(model, [])}
    assert choices["0"].reason == choices["1"].reason == "lazy, not materialised"
    assert choices["0"].shape == () and choices["0"].params == 0
    lazy = nn.Sequential(nn.LazyLinear(8), nn.ReLU(), nn.Linear(8, 3))
    lazy(torch.randn(2, 5))  # materialised: now a plain Linear(5, 8)
    assert reasons(lazy, []) == {"0": "", "2": ""}


def test_layers_whose_weight_torch_reads_directly_are_kept():
    """MultiheadAttention never calls out_proj; TransformerEncoderLayer's fused inference
    path (eval, no grad) never calls linear1/linear2. The decoder layer calls its own."""
    torch.manual_seed(0)
    enc = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    assert reasons(enc, []) == {
        "self_attn.out_proj": "weight read directly by TransformerEncoderLayer.forward",
        "linear1": "weight read directly by TransformerEncoderLayer.forward",
        "linear2": "weight read directly by TransformerEncoderLayer.forward",
    }
    dec = nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True).double()
    got = reasons(dec, [])
    assert got["linear1"] == got["linear2"] == ""
    assert got["self_attn.out_proj"] == got["multihead_attn.out_proj"] != ""
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    y = dec(x, x)
    layers = lowrank.convert(dec, [])
    full_rank_factors(layers)
    torch.testing.assert_close(dec(x, x), y, atol=1e-10, rtol=1e-10)


def test_parametrised_weights_and_hooked_layers_are_kept():
    hooked = nn.Linear(4, 4)
    hooked.register_forward_hook(lambda m, i, o: o * 2)
    model = nn.Sequential(parametrizations.weight_norm(nn.Linear(4, 4)), hooked, nn.Linear(4, 4))
    got = reasons(model, [])
    assert got["0"] == "weight computed from other parameters (parametrised)"
    assert got["1"] == "forward hooks registered on it (a replacement would drop them)"
    assert got["2"] == ""
    # the parametrisation's own tensors are not weight layers
    assert not [n for n in got if "parametrizations" in n]


def test_full_rank_layers_globs_match_a_layer_or_a_module_holding_it():
    model = timm.create_model("resnet18", num_classes=10)
    got = reasons(model, ["conv1", "layer4", "layer*.0.downsample.*", "fc"])
    assert got["conv1"] == "ab.full_rank_layers: 'conv1'"
    assert got["layer4.1.conv2"] == "ab.full_rank_layers: 'layer4'"  # a module: all of it
    assert got["layer4.0.downsample.0"] == "ab.full_rank_layers: 'layer4'"  # the first match
    assert got["layer2.0.downsample.0"] == "ab.full_rank_layers: 'layer*.0.downsample.*'"
    assert got["layer1.0.conv1"] == "" and got["layer3.1.conv2"] == ""
    assert not lowrank.matches("layer1.0.conv1", "Layer1")  # case-sensitive everywhere
    with pytest.raises(ConfigError, match=r"ab.full_rank_layers: 'heads' names no layer"):
        lowrank.survey(model, ["fc", "heads"])


def test_a_model_that_is_itself_a_linear_is_kept():
    assert reasons(nn.Linear(2, 2), []) == {"": "the model itself (nothing holds it to replace it)"}


def test_the_default_keeps_the_first_and_last_layer_that_could_be_factorised():
    from timm.layers import Conv2dSame

    model = nn.Sequential(
        Conv2dSame(3, 4, 3), nn.Conv2d(4, 4, 3), nn.Conv2d(4, 4, 3), nn.Linear(4, 4)
    )
    assert reasons(model) == {
        "0": "own forward (Conv2dSame)",
        "1": "first weight layer (default)",
        "2": "",
        "3": "last weight layer (default)",
    }
    assert reasons(nn.Sequential(nn.Linear(2, 2))) == {"0": "first weight layer (default)"}


def test_convert_on_the_meta_device_and_a_model_converted_before():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(8, 2))
    layers = lowrank.convert(model, None)
    assert list(layers) == ["1"] and layers["1"].weight.is_meta
    assert layers["1"].in_features == 8 and layers["1"].out_features == 8
    again = {c.name: c for c in lowrank.survey(model, None)}
    assert again["1"].factorised and again["1"].kind == "LowRankLayer"


# ---------------------------------------------------------------- the factorised forward
def full_rank_factors(layers: dict[str, lowrank.LowRankLayer], train: str = "a") -> None:
    """A·B = W at k = min(rows, cols), from the SVD in the weight's own dtype."""
    for layer in layers.values():
        w = lowrank.upright(layer.weight.detach())
        u, s, vh = torch.linalg.svd(w, full_matrices=False)
        layer.set_factors(*lowrank.split(u, s, vh, min(w.shape)), train=train)


CONVS = [
    dict(kernel_size=1),
    dict(kernel_size=3, padding=1),
    dict(kernel_size=(3, 5), padding=(1, 2)),
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=(5, 3), stride=(2, 1), padding=(2, 0), dilation=(1, 2)),
    dict(kernel_size=3, dilation=2, padding=2, bias=False),
    dict(kernel_size=3, padding="same"),
    dict(kernel_size=4, padding="same", dilation=2),  # even: padded unevenly
    dict(kernel_size=(2, 3), padding="valid"),
    dict(kernel_size=7, stride=4, bias=False),
    dict(kernel_size=3, padding=1, padding_mode="reflect"),
    dict(kernel_size=3, padding=(2, 1), padding_mode="circular", stride=2),
    dict(kernel_size=(1, 3), padding=(0, 1), padding_mode="replicate"),
    dict(kernel_size=3, padding="same", padding_mode="reflect"),
]


@pytest.mark.parametrize("wide", [False, True], ids=["4to6", "2to24"])
@pytest.mark.parametrize("kw", CONVS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_a_factorised_conv2d_at_full_rank_computes_what_the_conv_did(kw, wide):
    torch.manual_seed(0)
    conv = nn.Conv2d(2 if wide else 4, 24 if wide else 6, **kw).double()
    assert reasons(nn.Sequential(conv), []) == {"0": ""}
    x = torch.randn(2, conv.in_channels, 11, 9, dtype=torch.float64)
    y = conv(x)
    layer = lowrank.LowRankLayer(conv)
    torch.testing.assert_close(layer(x), y, rtol=0, atol=0)
    full_rank_factors({"l": layer})
    rows, cols = lowrank.as_matrix(conv.weight).shape
    assert layer.rank == min(rows, cols)
    torch.testing.assert_close(layer(x), y, rtol=1e-10, atol=1e-10)
    w = (layer.left() @ layer.right()).detach().reshape(layer.weight.shape)
    layer.merge()
    torch.testing.assert_close(layer.weight.detach(), w)
    torch.testing.assert_close(layer(x), y, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("shape", [(3, 7), (2, 4, 7), (2, 3, 4, 7)])
@pytest.mark.parametrize("bias", [True, False])
def test_a_factorised_linear_at_full_rank_computes_what_the_linear_did(shape, bias):
    torch.manual_seed(0)
    linear = nn.Linear(7, 5, bias=bias).double()
    x = torch.randn(*shape, dtype=torch.float64)
    y = linear(x)
    layer = lowrank.LowRankLayer(linear)
    full_rank_factors({"l": layer}, train="b")
    out = layer(x)
    assert out.shape == (*shape[:-1], 5)
    torch.testing.assert_close(out, y, rtol=1e-10, atol=1e-10)
    layer.merge()
    torch.testing.assert_close(layer(x), y, rtol=1e-10, atol=1e-10)


# ---------------------------------------------------------------- timm's models
def meta_model(arch: str, **kw) -> nn.Module:
    with torch.device("meta"):
        return timm.create_model(arch, num_classes=10, **kw)


def test_timm_convnext_keeps_its_depthwise_convolutions():
    model = meta_model("convnext_atto")
    got = reasons(model)
    depthwise = {n for n, m in model.named_modules() if n.endswith("conv_dw")}
    assert len(depthwise) == 12
    assert {n for n, r in got.items() if r == "depthwise convolution"} == depthwise
    assert got["stem.0"] == "first weight layer (default)"
    assert got["head.fc"] == "last weight layer (default)"
    assert all(r == "" for n, r in got.items() if n not in depthwise | {"stem.0", "head.fc"})


@pytest.mark.parametrize("arch", ["resnext26ts", "regnetx_002"])
def test_timm_grouped_convolutions_are_kept(arch):
    model = meta_model(arch)
    grouped = {
        n: m.groups for n, m in model.named_modules() if isinstance(m, nn.Conv2d) and m.groups > 1
    }
    assert grouped
    got = reasons(model)
    for name, groups in grouped.items():
        assert got[name] == f"grouped convolution (groups={groups})", name
    assert sum(r == "" for r in got.values()) == len(got) - len(grouped) - 2


def test_timm_vit_factorises_every_linear_but_the_head():
    model = meta_model("vit_tiny_patch16_224", img_size=32)
    got = reasons(model)
    linears = {n for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    assert {n for n, r in got.items() if r == ""} == linears - {"head"}
    assert got["patch_embed.proj"] == "first weight layer (default)"
    assert got["head"] == "last weight layer (default)"


def test_timm_efficientnet_keeps_its_same_padded_convs():
    got = reasons(meta_model("tf_efficientnet_b0"))
    assert got["conv_stem"] == "own forward (Conv2dSame)"
    assert got["blocks.0.0.conv_dw"] == "depthwise convolution"
    assert sum(r == "own forward (Conv2dSame)" for r in got.values()) == 5


@pytest.mark.parametrize(
    "arch,kw,size",
    [("vit_tiny_patch16_224", dict(img_size=32), 32), ("convnext_atto", {}, 32)],
)
def test_a_converted_timm_model_at_full_rank_computes_what_it_did(arch, kw, size):
    torch.manual_seed(0)
    model = timm.create_model(arch, num_classes=10, **kw).double().eval()
    plain = copy.deepcopy(model)
    x = torch.randn(2, 3, size, size, dtype=torch.float64)
    layers = lowrank.convert(model, None)
    assert len(layers) > 10
    full_rank_factors(layers)
    with torch.no_grad():
        torch.testing.assert_close(model(x), plain(x), rtol=1e-9, atol=1e-9)


# ---------------------------------------------------------------- results
def test_layers_csv_and_the_kept_layers_of_a_survey():
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, groups=1), nn.Conv2d(4, 4, 3, groups=4), nn.Linear(4, 4)
    )
    survey = lowrank.survey(model, ["0", "2*"])
    rows = list(csv.DictReader(io.StringIO(results.layers_csv(survey))))
    assert list(rows[0]) == results.LAYERS_CSV_HEADER.split(",")
    assert [(r["layer"], r["weight_shape"], r["factorised"], r["reason"]) for r in rows] == [
        ("0", "4x3x3x3", "0", "ab.full_rank_layers: '0'"),
        ("1", "4x1x3x3", "0", "depthwise convolution"),
        ("2", "4x4", "0", "ab.full_rank_layers: '2*'"),
    ]
    assert lowrank.kept_full_rank(survey)["1"] == "depthwise convolution"


# ---------------------------------------------------------------- check and the refusal
MLP1 = "model={name: mlp, width: 16, depth: 1, init: default}"


def test_check_lists_the_layers_their_shapes_and_parameters(capsys):
    assert main(["check", "--config", str(PARAMS), *sets(*TINY), "--layers"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1:3] == [
        "model mlp: 4 weight layers, 2 factorised by AB, 2 kept full rank:",
        "  first weight layer (default); last weight layer (default)",
    ]
    out = out[2:]
    table = out[1:8]
    assert table[0].split() == ["layer", "kind", "weight", "matrix", "W", "A", "B"]
    assert table[1].split()[:5] == ["layers.0", "Linear", "64x64", "64x64", "4,096"]
    assert table[1].endswith("  kept: first weight layer (default)")
    assert table[2].split() == ["layers.1", "Linear", "64x64", "64x64", "4,096", "4,096", "4,096"]
    assert table[4].split()[:5] == ["head", "Linear", "10x64", "10x64", "640"]
    assert table[5] == "factorised: 2 layers, 8,192 parameters (A 8,192 + B 8,192 at full rank)"
    assert table[6] == "kept full rank: 2 layers, 4,736 parameters"
    # 3 + 1 biases of 64 and 10, the norm's 2 x 64
    assert out[8] == f"other parameters (biases, norms, tokens): {3 * 64 + 10 + 128:,}"
    assert out[9] == f"total: {8192 + 4736 + 330:,} parameters"
    assert all(len(line) <= 100 for line in out[:10])


def test_check_without_layers_prints_one_line_about_them(capsys):
    assert main(["check", "--config", str(PARAMS), *sets(*TINY, "method=ddp")]) == 0
    out = capsys.readouterr().out
    assert "model mlp: 4 weight layers, 2 factorised by AB" in out
    assert "ddp trains every layer full rank" in out and "layer  " not in out


def sets(*overrides: str) -> list[str]:
    return [a for o in overrides for a in ("--set", o)]


def test_an_ab_method_with_nothing_to_factorise_is_refused_by_check(capsys):
    assert main(["check", "--config", str(PARAMS), *sets(*TINY, MLP1)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("error: model mlp: no layer for ab")
    assert "layers.0: first weight layer (default)" in err and "ab.full_rank_layers: []" in err
    assert main(["check", "--config", str(PARAMS), *sets(*TINY, MLP1, "method=ddp")]) == 0
    every = sets(*TINY, MLP1, "ab.full_rank_layers=[]")
    assert main(["check", "--config", str(PARAMS), *every]) == 0


@pytest.mark.parametrize(
    "model,why",
    [
        (nn.Sequential(nn.ReLU()), "the model has no weight layer"),
        (nn.Sequential(nn.Conv1d(2, 2, 3), nn.Embedding(3, 2)), "0: not a Linear/Conv2d"),
    ],
)
def test_a_model_without_a_linear_or_conv2d_is_refused(model, why):
    with pytest.raises(ConfigError, match=f"no layer for ab to factorise.*{why}"):
        check_model(tiny_config("ab.full_rank_layers=[]"), model)
    assert check_model(tiny_config("method=ddp"), model)


def test_train_and_the_launcher_refuse_it_before_any_process_starts(monkeypatch, capsys, tmp_path):
    import abtrain.__main__ as cli

    unused = str(tmp_path / "unused")

    def started(*a, **k):
        raise AssertionError("started")

    monkeypatch.setattr(cli, "_train", started)
    monkeypatch.setattr(localrun.subprocess, "Popen", started)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    args = ["train", "--config", str(PARAMS), *sets(*TINY, MLP1), "--out", unused]
    assert main(args) == 2
    assert capsys.readouterr().err.startswith("error: model mlp: no layer for ab")
    assert localrun.run_local(2, 1, args) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("error: model mlp: no layer for ab")
    bad = ["train", "--config", str(PARAMS), *sets(*TINY, "ab.full_rank_layers=[nope]")]
    assert localrun.run_local(2, 1, [*bad, "--out", unused]) == 2
    assert "ab.full_rank_layers: 'nope' names no layer" in capsys.readouterr().err
    # what may start is let through, and so is a model this process can't build
    ok = ["train", "--config", str(PARAMS), *sets(*TINY), "--out", unused]
    assert preflight.refusal(ok, 2, 1) is None
    assert preflight.refusal(["check", *ok[1:-2]], 2, 1) is None
    elsewhere = "model={name: python, factory: 'not_here:f', kwargs: {}, init: default}"
    assert preflight.refusal([*ok[:-2], *sets(elsewhere), "--out", unused], 2, 1) is None


RESNET18 = "model={name: timm, arch: resnet18, kwargs: {}, init: default}"
CIFAR = (
    "data={name: cifar10, source: null, sha256: null, prepared: data/prepared/none, "
    "train_per_class: 0, val_per_class: 0, real_labels: null, image_size: 32, augment: false, workers: 0}"
)


def test_check_lists_a_timm_resnet18(capsys):
    assert main(["check", "--config", str(PARAMS), *sets(*TINY, RESNET18, CIFAR), "--layers"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "model resnet18: 21 weight layers, 19 factorised by AB, 2 kept full rank:"
    rows = {line.split()[0]: line for line in out[4:25]}
    assert rows["conv1"].split()[:5] == ["conv1", "Conv2d", "64x3x7x7", "64x147", "9,408"]
    assert rows["conv1"].endswith("  kept: first weight layer (default)")
    # B is k x cols at k = min(64, 576) = 64: the most an AB phase holds
    assert rows["layer1.0.conv1"].split()[2:] == [
        "64x64x3x3",
        "64x576",
        "36,864",
        "4,096",
        "36,864",
    ]
    assert rows["fc"].split()[2:5] == ["10x512", "10x512", "5,120"]
    assert out[25].startswith("factorised: 19 layers, 11,157,504 parameters")
    assert out[28] == "total: 11,181,642 parameters"  # timm's resnet18 for 10 classes
    assert all(len(line) <= 100 for line in out[1:29])


FACTORY = """
from torch import nn


def no_linear(num_classes):
    return nn.Sequential(nn.Unflatten(1, (1, 64)), nn.Conv1d(1, num_classes, 64), nn.Flatten())


class Tied(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.inp = nn.Linear(64, 32)
        self.a = nn.Linear(32, 32)
        self.b = nn.Linear(32, 32, bias=False)
        self.b.weight = self.a.weight
        self.mid = nn.Linear(32, 32)
        self.head = nn.Linear(32, num_classes)

    def forward(self, x):
        return self.head(self.mid(self.b(self.a(self.inp(x)))))
"""


def python_model(tmp_path, monkeypatch, function: str) -> str:
    (tmp_path / "layers_factory.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    return (
        f"model={{name: python, factory: 'layers_factory:{function}', kwargs: {{}}, init: default}}"
    )


def test_check_counts_a_tied_weight_once(tmp_path, monkeypatch, capsys):
    tied = python_model(tmp_path, monkeypatch, "Tied")
    assert main(["check", "--config", str(PARAMS), *sets(*TINY, tied), "--layers"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1:4] == [
        "model Tied: 5 weight layers, 1 factorised by AB, 4 kept full rank:",
        "  first weight layer (default); weight shared with b.weight; weight shared with a.weight;",
        "  last weight layer (default)",
    ]
    rows = {line.split()[0]: line for line in out[5:10]}
    assert rows["a"].endswith("  kept: weight shared with b.weight")
    assert rows["mid"].split()[4:] == ["1,024", "1,024", "1,024"]
    assert out[10:14] == [
        "factorised: 1 layer, 1,024 parameters (A 1,024 + B 1,024 at full rank)",
        f"kept full rank: 4 layers, {64 * 32 + 32 * 32 + 10 * 32:,} parameters",  # a.weight once
        f"other parameters (biases, norms, tokens): {32 + 32 + 32 + 10:,}",
        f"total: {64 * 32 + 2 * 32 * 32 + 10 * 32 + 106:,} parameters",
    ]


def test_a_python_model_without_a_linear_or_conv2d_is_refused(tmp_path, monkeypatch, capsys):
    convs = python_model(tmp_path, monkeypatch, "no_linear")
    assert main(["check", "--config", str(PARAMS), *sets(*TINY, convs)]) == 2
    err = capsys.readouterr().err
    assert err == (
        "error: model no_linear: no layer for ab to factorise, every weight layer is kept "
        "full rank (1: not a Linear/Conv2d)\n"
    )


def test_summary_names_the_layers_kept_full_rank_and_why():
    from abtrain.run.runstate import RunState

    model = nn.Sequential(nn.Linear(4, 8), nn.Conv2d(8, 8, 3, groups=8), nn.Linear(8, 8))
    run = RunState(evals=[dict(step=1, val_top1=50.0, val_loss=1.0)])

    def summary(survey):
        return results.summarize(
            cfg=tiny_config(),
            run=run,
            factorizations=[],
            traffic=dict(inter_node_bytes=0, intra_node_bytes=0),
            where=dict(run_name="r", world_size=2, nodes=2, ranks_per_node=1),
            global_batch=32,
            train_samples=2000,
            survey=survey,
        )

    assert summary(lowrank.survey(model, ["0"]))["full_rank_layers"] == {
        "0": "ab.full_rank_layers: '0'",
        "1": "depthwise convolution",
    }
    assert summary(None)["full_rank_layers"] is None  # a full-rank method
