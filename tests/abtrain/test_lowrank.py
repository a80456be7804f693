import pytest
import torch
from torch import nn

from abtrain.distributed.ledger import Ledger
from abtrain.method import lowrank
from tests.helpers import spawn


def with_spectrum(sigma: list[float], m: int = 12, n: int = 9, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(m, len(sigma), generator=g))
    v, _ = torch.linalg.qr(torch.randn(n, len(sigma), generator=g))
    return u @ torch.diag(torch.tensor(sigma)) @ v.T


def test_full_rank_rebuilds_w_to_float32_precision():
    w = torch.randn(64, 48)
    a, b = lowrank.factorize(w, sigma_cutoff=1e-9)
    assert a.shape == (64, 48) and b.shape == (48, 48)
    torch.testing.assert_close(a @ b, w, atol=1e-5, rtol=1e-5)


def test_a_wide_conv_weight_is_turned_upright_as_the_authors_do():
    """(16, 8, 3, 3) is the matrix 16 × 72; the authors transpose a wide matrix before the
    SVD, so A is 72 × k (the long side) and B is k × 16 (the short side)."""
    w = torch.randn(16, 8, 3, 3)
    a, b = lowrank.factorize(w, sigma_cutoff=1e-9)
    assert a.shape == (72, 16) and b.shape == (16, 16)
    torch.testing.assert_close((a @ b).t().reshape(w.shape), w, atol=1e-5, rtol=1e-5)


ORIENTED = [  # (layer, A's shape, B's shape) at full rank
    (lambda: nn.Linear(16, 4), (16, 4), (4, 4)),  # wide: W is 4 × 16
    (lambda: nn.Linear(4, 12), (12, 4), (4, 4)),  # tall: W is 12 × 4
    (lambda: nn.Conv2d(8, 16, 3, padding=1), (72, 16), (16, 16)),  # wide: 16 × 72
]


@pytest.mark.parametrize("make,a_shape,b_shape", ORIENTED)
@pytest.mark.parametrize("role", ["a", "b"])
def test_factors_take_the_authors_orientation_and_the_role_trains_its_side(
    make, a_shape, b_shape, role
):
    """A is max(m, n) × k and B is k × min(m, n) whichever way W lies; the rank trains the
    factor of its role, and the layer computes W·x (up to float32) in A·B form."""
    torch.manual_seed(0)
    layer = lowrank.LowRankLayer(make())
    x = torch.randn(2, 8, 6, 6) if layer.is_conv else torch.randn(5, layer.weight.shape[1])
    want = layer(x)
    a, b = lowrank.factorize(layer.weight.detach(), sigma_cutoff=1e-9)
    layer.set_factors(a, b, role)
    assert tuple(layer.a.shape) == a_shape and tuple(layer.b.shape) == b_shape
    assert lowrank.factor_shapes(layer.weight.shape, a_shape[1]) == (a_shape, b_shape)
    trained = {n for n, p in layer.named_parameters() if p.requires_grad}
    assert trained == {role, "bias"}
    torch.testing.assert_close(layer(x), want, atol=1e-4, rtol=1e-4)
    w = layer.weight.detach().clone()
    layer.merge()  # W = A·B back in the weight's own orientation
    torch.testing.assert_close(layer.weight.detach(), w, atol=1e-5, rtol=1e-5)


def test_cutoff_keeps_values_strictly_above_cutoff_times_sigma_max():
    w = with_spectrum([10.0, 5.0, 2.0, 1.5, 0.1])
    a, b = lowrank.factorize(w, sigma_cutoff=0.15)  # keeps σ > 1.5: three of them
    assert a.shape == (12, 3) and b.shape == (3, 9)
    assert lowrank.keep_rank(torch.tensor([1.0, 0.01]), 0.5) == 1
    assert lowrank.keep_rank(torch.tensor([0.0, 0.0]), 0.5) == 1  # never zero


def test_factors_split_sigma_evenly():
    w = with_spectrum([4.0, 1.0])
    a, b = lowrank.factorize(w, 0.1)
    torch.testing.assert_close(a.norm(dim=0), b.norm(dim=1))  # both carry Σ^½


@pytest.mark.parametrize("to", ["a", "b"])
def test_the_authors_no_groups_split_gives_all_of_sigma_to_the_trained_factor(to):
    w = with_spectrum([4.0, 2.0, 1.0])
    u, s, vh = lowrank.svd(w)
    a, b = lowrank.split(u, s, vh, 3, to)
    torch.testing.assert_close(a @ b, w, atol=1e-5, rtol=1e-5)
    trained, frozen = (
        (a.norm(dim=0), b.norm(dim=1)) if to == "a" else (b.norm(dim=1), a.norm(dim=0))
    )
    torch.testing.assert_close(trained, s[:3])  # B = ΣVᵀ (or A = UΣ): σ in the trained factor
    torch.testing.assert_close(frozen, torch.ones(3))  # U (or Vᵀ): orthonormal


def _nogroups_split(rank, world):
    from abtrain.method import sync

    layer = lowrank.LowRankLayer(nn.Linear(6, 8))
    with torch.no_grad():
        layer.weight.copy_(with_spectrum([5.0, 3.0, 1.0, 0.5, 0.2, 0.1], m=8, n=6))
    sync.factorize_layers({"l": layer}, 0.15, "b", Ledger(rank, [0, 1]), split_sigma=False)
    return layer.a.norm(dim=0).tolist(), layer.b.norm(dim=1).tolist(), layer.b.requires_grad


@pytest.mark.multiprocess
def test_no_groups_factorises_the_authors_way_when_told():
    """ab.split_sigma=false, as the authors' "no groups" at c3dbc10: every rank trains
    B = ΣVᵀ against a frozen, orthonormal A = U (k = 3 of 6 above 0.15·σ_max)."""
    for a_norms, b_norms, trains_b in spawn(_nogroups_split, world=2, ranks_per_node=1):
        assert a_norms == pytest.approx([1.0] * 3, abs=1e-5) and trains_b
        assert b_norms == pytest.approx([5.0, 3.0, 1.0], rel=1e-4)


@pytest.mark.parametrize(
    "make", [lambda: nn.Linear(10, 7), lambda: nn.Conv2d(3, 6, 3, padding=1, stride=2)]
)
def test_factorised_layer_runs_as_two_small_ops_equal_to_rebuilt_w(make):
    torch.manual_seed(0)
    layer = lowrank.LowRankLayer(make())
    x = torch.randn(4, 10) if not layer.is_conv else torch.randn(2, 3, 8, 8)
    a, b = lowrank.factorize(layer.weight.detach(), 0.3)
    layer.set_factors(a, b, train="b")
    assert not layer.a.requires_grad and layer.b.requires_grad and not layer.w.requires_grad
    y = layer(x)
    y.sum().backward()
    assert layer.a.grad is None and layer.b.grad is not None and layer.w.grad is None
    layer.merge()
    assert layer.weight.requires_grad and not layer.b.requires_grad
    torch.testing.assert_close(layer(x), y.detach(), atol=1e-5, rtol=1e-5)


def model():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3),
        nn.Flatten(),
        nn.Linear(8, 16),
        nn.LayerNorm(16),
        nn.Linear(16, 16),
        nn.Linear(16, 4),
    )


def test_convert_keeps_first_and_last_layer_full_rank_by_default():
    m = model()
    layers = lowrank.convert(m, None)
    assert list(layers) == ["2", "4"]
    assert isinstance(m[0], nn.Conv2d) and isinstance(m[5], nn.Linear)
    assert list(lowrank.convert(model(), ["4", "0"])) == ["2", "5"]
    assert list(lowrank.convert(model(), [])) == ["0", "2", "4", "5"]


def test_compression_counts_every_parameter():
    m = model()
    full = sum(p.numel() for p in m.parameters())
    layers = lowrank.convert(m, None)
    assert lowrank.parameter_counts(m) == (full, full)
    for layer in layers.values():
        a, b = lowrank.factorize(layer.weight.detach(), 0.1, rank=2)
        layer.set_factors(a, b, "a")
    # 16x8 -> 16x2 + 2x8 ; 16x16 -> 16x2 + 2x16
    current = full - 16 * 8 - 16 * 16 + (32 + 16) + (32 + 32)
    assert lowrank.parameter_counts(m) == (full, current)
    assert lowrank.compression_ratio(m) == pytest.approx(full / current)


def _agree(rank, world):
    from abtrain.method import sync

    torch.manual_seed(0)
    layer = lowrank.LowRankLayer(nn.Linear(9, 12))
    spectra = [
        [10, 5, 2, 1.5, 0.1],
        [10, 5, 0.5, 0.1, 0.1],
        [10, 0.1, 0.1, 0.1, 0.1],
        [10, 5, 2, 1.6, 1.55],
    ]
    with torch.no_grad():
        layer.weight.copy_(with_spectrum([float(s) for s in spectra[rank]], seed=rank))
    own = lowrank.keep_rank(lowrank.svd(layer.weight.detach())[1], 0.15)
    ranks = sync.factorize_layers({"l": layer}, 0.15, "a", Ledger(rank, [0, 0, 1, 1]))
    return own, ranks["l"], tuple(layer.a.shape), tuple(layer.b.shape)


@pytest.mark.multiprocess
def test_rank_agrees_across_ranks_whose_sigma_differ():
    results = spawn(_agree)
    assert [r[0] for r in results] == [3, 2, 1, 5]  # each rank alone would differ
    assert {r[1:] for r in results} == {(5, (12, 5), (5, 9))}  # the world keeps the max


def test_svd_falls_back_to_float64_where_lapack_fails_in_float32(monkeypatch):
    """MKL's float32 SVD failed on one thread on a well-conditioned 1024 × 1024 weight
    ("Parameter 4 was incorrect on entry to SLASCL"); that matrix is decomposed in float64."""
    real = torch.linalg.svd

    def flaky(m, full_matrices=True):
        if m.dtype == torch.float32:
            raise torch.linalg.LinAlgError("linalg.svd: The algorithm failed to converge")
        return real(m, full_matrices=full_matrices)

    w = torch.randn(12, 3, 2, 2)
    monkeypatch.setattr(torch.linalg, "svd", flaky)
    u, s, vh = lowrank.svd(w)
    assert u.dtype == s.dtype == vh.dtype == torch.float32
    torch.testing.assert_close((u * s) @ vh, w.reshape(12, -1), atol=1e-5, rtol=1e-5)
