import pytest
import torch

from abtrain import lowrank, models
from abtrain.models.init import ortho_sigma_
from tests.conftest import tiny_config

VIT = "{name: vit, image_size: 16, patch_size: 4, width: 32, depth: 2, heads: 2, mlp_ratio: 2.0, qkv_bias: false, drop_path: 0.0, init: ortho_sigma}"


def fwd_bwd(model, size, classes=10):
    x = torch.randn(2, 3, size, size)
    out = model(x)
    assert out.shape == (2, classes)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize(
    "model,size",
    [
        (VIT, 16),
        ("{name: resnet50, dropout: 0.0, zero_init_last: false, init: default}", 32),
        ("{name: vgg16, layout: torchvision, width: 64, dropout: 0.0, init: default}", 32),
        ("{name: vgg16, layout: timm, width: 64, dropout: 0.0, init: default}", 32),
    ],
)
def test_each_model_builds_and_trains_a_step(model, size):
    fwd_bwd(models.build(tiny_config(f"model={model}"), classes=10), size)


def test_mini_vit_as_the_authors_configured_it_has_42_8m_parameters():
    cfg = tiny_config(
        "model={name: vit, image_size: 32, patch_size: 8, width: 768, depth: 6, heads: 6, "
        "mlp_ratio: 4.0, qkv_bias: false, drop_path: 0.0, init: default}"
    )
    with torch.device("meta"):
        model = models.build(cfg, classes=100)
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(42.8e6, rel=0.005)
    assert model.pos_embed.shape == (1, 17, 768)  # 16 patches + class token


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
    y = model(x)
    for layer in layers.values():
        a, b = lowrank.factorize(layer.weight.detach(), 1e-9)
        layer.set_factors(a, b, "a")
    torch.testing.assert_close(model(x), y, atol=1e-4, rtol=1e-4)
    fwd_bwd(model, 16)


def test_timm_vgg_pools_a_32px_feature_map_up_to_7x7_for_its_conv_classifier():
    model = models.build(
        tiny_config("model={name: vgg16, layout: timm, width: 64, dropout: 0.0, init: default}"), 10
    )
    fc1 = model.pre_logits[0]
    assert isinstance(fc1, torch.nn.Conv2d) and fc1.weight.shape == (4096, 512, 7, 7)
    layers = lowrank.convert(model, None)
    assert "pre_logits.0" in layers and "features.0" not in layers and "head" not in layers


@pytest.mark.parametrize("layout", ["torchvision", "timm"])
def test_vgg16_width_scales_every_layer_and_keeps_the_layout(layout):
    def build(width):
        cfg = tiny_config(
            f"model={{name: vgg16, layout: {layout}, width: {width}, dropout: 0.0, init: default}}"
        )
        with torch.device("meta"):
            return models.build(cfg, classes=10)

    full, mini = build(64), build(8)
    assert sum(p.numel() for p in full.parameters()) == pytest.approx(134.3e6, rel=0.005)
    shapes = {n: p.shape for n, p in full.named_parameters()}
    small = {n: p.shape for n, p in mini.named_parameters()}
    assert list(small) == list(shapes)  # the same layers, names and order
    for name, shape in shapes.items():  # widths / 8; the 3 input channels, 10 classes kept
        assert all(a in (b, b // 8) for a, b in zip(small[name], shape)), name
    first = "pre_logits.0.weight" if layout == "timm" else "classifier.0.weight"
    assert small[first].numel() * 64 == shapes[first].numel()
    model = f"{{name: vgg16, layout: {layout}, width: 8, dropout: 0.0, init: ortho_sigma}}"
    fwd_bwd(models.build(tiny_config(f"model={model}"), classes=10), 32)


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


def test_regularisation_of_the_authors_runs_drop_path_and_dropout():
    vit_cfg = tiny_config("model=" + VIT.replace("drop_path: 0.0", "drop_path: 0.5"))
    vit = models.build(vit_cfg, classes=10)
    assert [b.drop for b in vit.blocks] == [0.0, 0.5]  # rising over the blocks, as timm's
    x = torch.randn(8, 3, 16, 16)
    vit.train()
    assert not torch.equal(vit(x), vit(x))  # whole residual branches dropped per sample
    vit.eval()
    assert torch.equal(vit(x), vit(x))
    r50 = models.build(
        tiny_config("model={name: resnet50, dropout: 0.1, zero_init_last: false, init: default}"),
        10,
    )
    assert isinstance(r50.avgpool[1], torch.nn.Dropout) and r50.avgpool[1].p == 0.1
    assert "fc.weight" in r50.state_dict()  # the classifier keeps its name
