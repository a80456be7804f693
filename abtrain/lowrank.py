"""W = A·B: the SVD split, and layers that can hold their weight either way.

A conv weight (out, in, kh, kw) is treated as the matrix out × in·kh·kw. In factorised form a
Linear runs as two matmuls and a conv as a k-channel conv followed by a 1×1 conv, so the
full W is never rebuilt during the AB phase.
"""

from __future__ import annotations

import fnmatch

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def as_matrix(weight: Tensor) -> Tensor:
    return weight.reshape(weight.shape[0], -1)


def keep_rank(sigma: Tensor, sigma_cutoff: float) -> int:
    """How many singular values lie strictly above sigma_cutoff·σ_max (at least 1)."""
    return max(1, int((sigma > sigma_cutoff * sigma[0]).sum()))


def svd(weight: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Thin SVD of the matrix view, in float32 whatever the parameter's dtype.

    LAPACK's float32 divide-and-conquer SVD can fail on a well-conditioned matrix (seen with
    MKL on one thread: "Parameter 4 was incorrect on entry to SLASCL", σ between 0.5 and 2):
    such a matrix is decomposed again in float64, deterministically, so every rank holding
    the same weights still gets the same factors.
    """
    m = as_matrix(weight).float()
    try:
        return torch.linalg.svd(m, full_matrices=False)
    except torch.linalg.LinAlgError:
        u, s, vh = torch.linalg.svd(m.double(), full_matrices=False)
        return u.float(), s.float(), vh.float()


def split(
    u: Tensor, s: Tensor, vh: Tensor, k: int, sigma_to: str = "both"
) -> tuple[Tensor, Tensor]:
    """A = U_k Σ_k^½ (out × k), B = Σ_k^½ V_kᵀ (k × in·kh·kw); with `sigma_to` 'a' or 'b'
    that factor takes all of Σ_k (A = U_k Σ_k, B = V_kᵀ; or A = U_k, B = Σ_k V_kᵀ)."""
    if sigma_to == "a":
        return u[:, :k] * s[:k], vh[:k]
    if sigma_to == "b":
        return u[:, :k], s[:k, None] * vh[:k]
    root = s[:k].sqrt()
    return u[:, :k] * root, root[:, None] * vh[:k]


def factorize(
    weight: Tensor, sigma_cutoff: float, rank: int | None = None
) -> tuple[Tensor, Tensor]:
    """Split W into A, B, keeping `rank` singular values or those above the cutoff."""
    u, s, vh = svd(weight)
    k = keep_rank(s, sigma_cutoff) if rank is None else rank
    a, b = split(u, s, vh, k)
    return a.to(weight.dtype), b.to(weight.dtype)


class LowRankLayer(nn.Module):
    """A Linear or Conv2d whose weight is trained as W, or as A·B with one factor frozen.

    `weight` and `bias` keep their names, so state dicts read like the original layer's.
    """

    def __init__(self, layer: nn.Linear | nn.Conv2d) -> None:
        super().__init__()
        self.is_conv = isinstance(layer, nn.Conv2d)
        if self.is_conv:
            self.conv = dict(stride=layer.stride, padding=layer.padding, dilation=layer.dilation)
        self.weight = layer.weight
        self.bias = layer.bias
        empty = torch.empty(0, dtype=layer.weight.dtype, device=layer.weight.device)
        self.a = nn.Parameter(empty.clone(), requires_grad=False)
        self.b = nn.Parameter(empty.clone(), requires_grad=False)
        self.factorized = False

    @property
    def rank(self) -> int:
        return self.a.shape[1] if self.a.dim() == 2 else 0

    def set_factors(self, a: Tensor, b: Tensor, train: str) -> None:
        """Switch to A·B form, training only `train` ('a' or 'b')."""
        self.a.data = a.contiguous()
        self.b.data = b.contiguous()
        self.factorized = True
        self.weight.requires_grad_(False)
        self.a.requires_grad_(train == "a")
        self.b.requires_grad_(train == "b")

    def merge(self) -> None:
        """Back to full rank: W = A·B, factors kept (their shapes tell the last rank)."""
        with torch.no_grad():  # the product in float32 whatever the parameters' dtype
            self.weight.copy_((self.a.float() @ self.b.float()).view_as(self.weight))
        self.factorized = False
        self.weight.requires_grad_(True)
        self.a.requires_grad_(False)
        self.b.requires_grad_(False)

    def forward(self, x: Tensor) -> Tensor:
        if not self.is_conv:
            if not self.factorized:
                return F.linear(x, self.weight, self.bias)
            return F.linear(F.linear(x, self.b), self.a, self.bias)
        if not self.factorized:
            return F.conv2d(x, self.weight, self.bias, **self.conv)
        k = self.rank
        b = self.b.view(k, *self.weight.shape[1:])
        a = self.a.view(self.weight.shape[0], k, 1, 1)
        return F.conv2d(F.conv2d(x, b, None, **self.conv), a, self.bias)

    def extra_repr(self) -> str:
        kind = "conv" if self.is_conv else "linear"
        return f"{kind} {tuple(self.weight.shape)}, rank={self.rank or 'full'}"


def _factorisable(module: nn.Module) -> bool:
    if isinstance(module, nn.Conv2d):
        return module.groups == 1 and module.padding_mode == "zeros"
    return type(module) is nn.Linear or isinstance(module, nn.Linear)


def convert(model: nn.Module, full_rank_layers: list[str] | None) -> dict[str, LowRankLayer]:
    """Replace every factorisable Linear/Conv2d by a LowRankLayer, in place.

    `full_rank_layers` are glob patterns of module names kept as they are; None keeps the
    first and the last weight layer (patch embedding / first conv and classifier head).
    """
    candidates = [name for name, m in model.named_modules() if _factorisable(m)]
    if full_rank_layers is None:
        keep = {candidates[0], candidates[-1]} if candidates else set()
    else:
        keep = {n for n in candidates if any(fnmatch.fnmatch(n, p) for p in full_rank_layers)}
    layers = {}
    for name in candidates:
        if name in keep:
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        layer = LowRankLayer(getattr(parent, child))
        setattr(parent, child, layer)
        layers[name] = layer
    return layers


def low_rank_layers(model: nn.Module) -> dict[str, LowRankLayer]:
    return {n: m for n, m in model.named_modules() if isinstance(m, LowRankLayer)}


def parameter_counts(model: nn.Module) -> tuple[int, int]:
    """(full-rank count, current count) over every parameter, biases and tokens included.

    A layer counts as A+B once it has been factorised (its last factorisation), as W before.
    """
    full = current = 0
    seen = set()
    for layer in low_rank_layers(model).values():
        w = layer.weight.numel()
        full += w
        current += layer.a.numel() + layer.b.numel() if layer.rank else w
        seen.update({id(layer.weight), id(layer.a), id(layer.b)})
    for p in model.parameters():
        if id(p) not in seen:
            full += p.numel()
            current += p.numel()
    return full, current


def compression_ratio(model: nn.Module) -> float:
    full, current = parameter_counts(model)
    return full / current


def fit_shape(t: Tensor, shape: torch.Size) -> Tensor:
    """Truncate or zero-pad `t` to `shape`, keeping the top-left corner."""
    out = t.new_zeros(shape)
    if t.dim() == len(shape):
        region = tuple(slice(0, min(a, b)) for a, b in zip(t.shape, shape))
        out[region] = t[region]
    return out


def adapt_optimizer_state(
    opt: torch.optim.Optimizer, layers: dict[str, LowRankLayer], mode: str
) -> None:
    """AdamW's moments across a change of shape: carried (cut or zero-padded) or reset."""
    for layer in layers.values():
        for p in (layer.weight, layer.a, layer.b):
            state = opt.state.get(p)
            if not state:
                continue
            if mode == "reset":
                del opt.state[p]
                continue
            for key in ("exp_avg", "exp_avg_sq"):
                if state[key].shape != p.shape:
                    state[key] = fit_shape(state[key], p.shape)
