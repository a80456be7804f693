"""Models: timm architectures by name, a user's own factory, lazy layers, the init, and the
paper's models (timm's, with the authors' arguments) as the paper profile builds them."""

import textwrap

import pytest
import torch
import yaml

from abtrain import config, models
from abtrain.config import ConfigError
from abtrain.method import lowrank
from abtrain.models.init import ortho_sigma_
from tests.helpers import ROOT, tiny_config

VIT = (
    "{name: python, factory: 'timm.models.vision_transformer:VisionTransformer', kwargs: "
    "{img_size: 16, patch_size: 4, embed_dim: 32, depth: 2, num_heads: 2, mlp_ratio: 2.0, "
    "qkv_bias: false, drop_path_rate: 0.0}, init: ortho_sigma}"
)
IMAGES = (
    "data={name: cifar10, source: null, sha256: null, prepared: unused, train_per_class: 0, "
    "val_per_class: 0, real_labels: null, image_size: 8, augment: false, workers: 0}"
)
PAPER = yaml.safe_load((ROOT / "profiles" / "paper.yaml").read_text())


def fwd_bwd(model, size, classes=10):
    x = torch.randn(2, 3, size, size)
    out = model(x)
    assert out.shape == (2, classes)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return list(sa) == list(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)


def user_module(tmp_path, monkeypatch, source: str, suffix: str = "") -> str:
    """A module of the test's own, importable under a name no other test uses."""
    name = f"user_models_{tmp_path.name}{suffix}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def python_model(spec: str, kwargs: str = "{}", *more: str):
    return tiny_config(
        f"model={{name: python, factory: '{spec}', kwargs: {kwargs}, init: default}}", *more
    )


@pytest.mark.parametrize(
    "model,size",
    [
        (VIT, 16),
        ("{name: timm, arch: resnet18, kwargs: {}, init: default}", 32),
        ("{name: timm, arch: vit_tiny_patch16_224, kwargs: {img_size: 32}, init: default}", 32),
        (
            "{name: python, factory: 'abtrain.models.vgg:vgg16', kwargs: {width: 8}, "
            "init: ortho_sigma}",
            32,
        ),
    ],
)
def test_each_model_builds_and_trains_a_step(model, size):
    fwd_bwd(models.build(tiny_config(f"model={model}"), classes=10), size)


# ------------------------------------------------------------------ timm by name
def test_a_timm_architecture_by_name_builds_with_the_data_classes_and_its_kwargs():
    cfg = tiny_config(
        "model={name: timm, arch: resnet18, kwargs: {drop_rate: 0.25}, init: default}"
    )
    model = models.build(cfg, classes=7)
    assert type(model).__name__ == "ResNet" and model.fc.out_features == 7
    assert model.drop_rate == 0.25
    assert models.label(cfg.model) == "resnet18"


def test_an_unknown_timm_architecture_names_the_key_and_the_closest_names():
    with pytest.raises(ConfigError, match="model.arch") as err:
        tiny_config("model={name: timm, arch: resnet5, kwargs: {}, init: default}")
    assert "'resnet5'" in str(err.value) and "resnet50" in str(err.value)


def test_arguments_the_architecture_refuses_name_model_kwargs():
    cfg = tiny_config("model={name: timm, arch: resnet18, kwargs: {no_such: 1}, init: default}")
    with pytest.raises(ConfigError, match="model.kwargs") as err:
        models.build(cfg, classes=10)
    assert "no_such" in str(err.value)
    for reserved in ("num_classes: 3", "pretrained: true"):  # from the data; never downloaded
        with pytest.raises(ConfigError, match="model.kwargs"):
            tiny_config(
                f"model={{name: timm, arch: resnet18, kwargs: {{{reserved}}}, init: default}}"
            )


# ------------------------------------------------------------------ a user's factory
def test_a_users_factory_builds_the_same_weights_on_every_build(tmp_path, monkeypatch):
    name = user_module(
        tmp_path,
        monkeypatch,
        """
        from torch import nn

        def small_net(num_classes, hidden=8):
            return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))
        """,
    )
    cfg = python_model(f"{name}:small_net", "{hidden: 12}")
    a, b = models.build(cfg, classes=5), models.build(cfg, classes=5)
    assert a[0].out_features == 12 and a[2].out_features == 5
    assert same_weights(a, b)  # seeded from cfg.seed: every rank alike
    other = models.build(config.from_dict(cfg.dump(), ["seed=1"]), classes=5)
    assert not same_weights(a, other)
    assert models.label(cfg.model) == "small_net"


def test_a_factory_that_cannot_be_used_names_model_factory_and_what_is_wrong(tmp_path, monkeypatch):
    name = user_module(
        tmp_path,
        monkeypatch,
        """
        def not_a_model(num_classes):
            return {"classes": num_classes}
        """,
    )
    broken = user_module(tmp_path, monkeypatch, "raise RuntimeError('boom at import')\n", "_b")
    cases = {
        "no_such_module_abtrain:build": ["'no_such_module_abtrain'", "No module named"],
        f"{broken}:build": [f"'{broken}'", "boom at import"],
        f"{name}:missing": [f"'{name}'", "'missing'"],
        f"{name}:not_a_model": ["returned dict, not a torch.nn.Module"],
    }
    for spec, words in cases.items():
        with pytest.raises(ConfigError, match="model.factory") as err:
            models.build(python_model(spec), classes=3)
        for word in words:
            assert word in str(err.value), (spec, str(err.value))
    # no colon: refused as the config is read, before anything is imported
    with pytest.raises(ConfigError, match="model.factory") as err:
        python_model("torch.nn.Linear")
    assert "package.module:function" in str(err.value)


# ------------------------------------------------------------------ lazy layers
def test_lazy_layers_are_materialised_alike_on_every_build(tmp_path, monkeypatch):
    name = user_module(
        tmp_path,
        monkeypatch,
        """
        from torch import nn

        def lazy_net(num_classes):
            layers = [nn.Flatten(), nn.LazyLinear(16), nn.ReLU(), nn.LazyLinear(num_classes)]
            return nn.Sequential(*layers)
        """,
    )
    images = python_model(f"{name}:lazy_net", "{}", IMAGES)
    a, b = models.build(images, classes=4), models.build(images, classes=4)
    assert not any(isinstance(p, torch.nn.UninitializedParameter) for p in a.parameters())
    assert type(a[1]) is torch.nn.Linear and a[1].weight.shape == (16, 3 * 8 * 8)
    assert same_weights(a, b) and a.training  # built in train mode, as every model
    synthetic = python_model(f"{name}:lazy_net")  # the tiny config's 64 features
    assert models.build(synthetic, classes=4)[1].weight.shape == (16, 64)
    with torch.device("meta"):  # the planner builds models on the meta device
        assert models.build(images, classes=4)[3].weight.shape == (4, 16)


# ------------------------------------------------------------------ the init, the ViT
def test_ortho_sigma_sets_every_singular_value_to_one_identically_on_every_build():
    a = models.build(tiny_config(f"model={VIT}"), classes=10)
    b = models.build(tiny_config(f"model={VIT}"), classes=10)
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), name
        if p.dim() >= 2:
            s = torch.linalg.svdvals(p.detach().reshape(p.shape[0], -1))
            torch.testing.assert_close(s, torch.ones_like(s), atol=1e-5, rtol=0)
    m = torch.nn.Linear(5, 3)
    ortho_sigma_(m)
    torch.testing.assert_close(m.weight @ m.weight.T, torch.eye(3), atol=1e-5, rtol=0)


def test_vit_factorises_fused_qkv_and_keeps_patch_embedding_and_head_full_rank():
    model = models.build(tiny_config(f"model={VIT}"), classes=10)
    layers = lowrank.convert(model, None)
    assert "patch_embed.proj" not in layers and "head" not in layers
    assert {
        "blocks.0.attn.qkv",
        "blocks.0.attn.proj",
        "blocks.0.mlp.fc1",
        "blocks.1.mlp.fc2",
    } <= set(layers)
    assert layers["blocks.0.attn.qkv"].weight.shape == (96, 32)
    x = torch.randn(2, 3, 16, 16)
    model.eval()
    y = model(x)
    for layer in layers.values():
        a, b = lowrank.factorize(layer.weight.detach(), 1e-9)
        layer.set_factors(a, b, "a")
    torch.testing.assert_close(model(x), y, atol=1e-4, rtol=1e-4)
    model.train()
    fwd_bwd(model, 16)


def test_drop_path_rises_over_the_blocks_and_only_acts_in_training():
    vit = models.build(
        tiny_config("model=" + VIT.replace("drop_path_rate: 0.0", "drop_path_rate: 0.5")), 10
    )
    assert isinstance(vit.blocks[0].drop_path1, torch.nn.Identity)  # rate 0: as timm
    assert vit.blocks[1].drop_path1.drop_prob == 0.5
    x = torch.randn(8, 3, 16, 16)
    vit.train()
    assert not torch.equal(vit(x), vit(x))  # whole residual branches dropped per sample
    vit.eval()
    assert torch.equal(vit(x), vit(x))


# ------------------------------------------------------------------ VGG16 at any width
def test_vgg16_width_scales_every_layer_and_keeps_timms_layout_and_names():
    def build(width):
        cfg = python_model("abtrain.models.vgg:vgg16", f"{{width: {width}}}")
        with torch.device("meta"):
            return models.build(cfg, classes=10)

    full, mini = build(64), build(8)
    assert sum(p.numel() for p in full.parameters()) == pytest.approx(134.3e6, rel=0.005)
    shapes = {n: p.shape for n, p in full.named_parameters()}
    small = {n: p.shape for n, p in mini.named_parameters()}
    assert list(small) == list(shapes)  # the same layers, names and order
    for name, shape in shapes.items():  # widths / 8; the 3 input channels, 10 classes kept
        assert all(a in (b, b // 8) for a, b in zip(small[name], shape)), name
    assert small["pre_logits.fc1.weight"].numel() * 64 == shapes["pre_logits.fc1.weight"].numel()
    assert small["head.fc.weight"] == (10, 512)  # the classifier's 4096, scaled too
    with torch.device("meta"):
        import timm

        theirs = timm.create_model("vgg16", pretrained=False, num_classes=10)
    assert {n: p.shape for n, p in theirs.named_parameters()} == shapes
    with pytest.raises(ConfigError, match="model.kwargs.width"):
        build(0)


def test_timms_vgg16_pools_a_32px_feature_map_up_to_7x7_for_its_conv_classifier():
    model = models.build(python_model("abtrain.models.vgg:vgg16", "{width: 8}"), 10)
    fc1 = model.pre_logits.fc1
    assert isinstance(fc1, torch.nn.Conv2d) and fc1.weight.shape == (512, 64, 7, 7)
    model(torch.randn(2, 3, 32, 32))  # 1x1 features, pooled up to fc1's 7x7
    layers = lowrank.convert(model, None)
    assert "pre_logits.fc1" in layers and "features.0" not in layers and "head.fc" not in layers


@pytest.mark.slow  # two VGG16s of 134M parameters on the CPU
def test_vgg16_at_width_64_is_timms_vgg16_bit_for_bit():
    import timm

    cfg = python_model("abtrain.models.vgg:vgg16", "{width: 64}")
    ours = models.build(cfg, classes=10)
    torch.manual_seed(cfg.seed)
    assert same_weights(ours, timm.create_model("vgg16", pretrained=False, num_classes=10))


# ------------------------------------------------------------------ the paper's models
def paper_config(run: str | None = None, *more: str) -> config.Config:
    if run is None:
        return config.from_dict(PAPER["train"], list(more))
    r = PAPER["experiments"]["runs"][run]
    return config.from_dict(PAPER["train"], [f"method={r['method']}", *r.get("set", []), *more])


def test_the_paper_profiles_models_are_timms_with_the_authors_arguments():
    vit_cfg = paper_config()
    with torch.device("meta"):
        vit = models.build(vit_cfg, classes=1000)
        vgg = models.build(paper_config("vgg-ab-2n"), classes=10)
        mini = models.build(paper_config(None, *PAPER["search"]["train"]), classes=100)
    # ViT-B/16 without the qkv bias: 86.6M less 12 x 2304
    assert models.label(vit_cfg.model) == "vit_base_patch16_224"
    assert sum(p.numel() for p in vit.parameters()) == 86_567_656 - 12 * 2304
    assert vit.blocks[0].attn.qkv.bias is None and vit.patch_embed.img_size == (224, 224)
    assert vit.blocks[-1].drop_path1.drop_prob == pytest.approx(0.1)
    assert sum(p.numel() for p in vgg.parameters()) == 134_301_514
    assert vgg.pre_logits.fc1.weight.shape == (4096, 512, 7, 7)
    # the authors' mini-ViT (configs/model/vit.yaml): 16 patches + class token, 42.8M
    assert sum(p.numel() for p in mini.parameters()) == pytest.approx(42.8e6, rel=0.005)
    assert mini.pos_embed.shape == (1, 17, 768)


def test_the_paper_profiles_resnet50_drops_before_its_classifier_and_zeroes_each_last_bn():
    cfg = paper_config("r50-ab-4n-local", "model.init=default")  # ortho_sigma: minutes of SVDs
    model = models.build(cfg, classes=10)
    assert models.label(cfg.model) == "resnet50" and model.drop_rate == 0.1
    assert "fc.weight" in model.state_dict()  # full_rank_layers patterns name it so
    last = [b.bn3.weight for layer in (model.layer1, model.layer2, model.layer3, model.layer4)
            for b in layer]  # fmt: skip
    assert len(last) == 16 and all(float(w.detach().abs().max()) == 0 for w in last)


def test_label_names_the_model_for_run_names_and_baselines():
    assert models.label(tiny_config().model) == "mlp"
    assert models.label(dict(name="vgg16", layout="timm", width=16)) == "vgg16"  # older runs
    assert models.label(dict(name="timm", arch="resnet50", kwargs={})) == "resnet50"
    spec = dict(name="python", factory="pkg.models:Net.small", kwargs={})
    assert models.label(spec) == "small"
