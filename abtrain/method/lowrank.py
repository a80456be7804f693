"""W = A·B: the SVD split, and layers that can hold their weight either way.

A conv weight (out, in, kh, kw) is treated as the matrix out × in·kh·kw. As the authors' code
does, that matrix is turned upright before the SVD: a wide one (out < in·kh·kw) is transposed,
so A is always the long side (max × k) and B the short one (k × min). Which factor a group
trains, and what the "no groups" runs train and send, follows from that rule. In factorised
form a Linear runs as two matmuls and a conv as a k-channel conv followed by a 1×1 conv, so
the full W is never rebuilt during the AB phase.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.parameter import UninitializedParameter
from torch.nn.utils import parametrize


def as_matrix(weight: Tensor) -> Tensor:
    return weight.reshape(weight.shape[0], -1)


def is_wide(shape: tuple[int, ...] | torch.Size) -> bool:
    """The matrix view out × in·kh·kw has fewer rows than columns (the authors transpose it)."""
    return shape[0] < math.prod(shape[1:])


def upright(weight: Tensor) -> Tensor:
    """The matrix the SVD splits: the matrix view, transposed if wide (rows ≥ cols)."""
    m = as_matrix(weight)
    return m.t() if is_wide(weight.shape) else m


def factor_shapes(shape: tuple[int, ...] | torch.Size, k: int) -> tuple[tuple[int, int], ...]:
    """The shapes of A and B of a weight of `shape` at rank k: (max × k), (k × min)."""
    rows, cols = shape[0], math.prod(shape[1:])
    return (max(rows, cols), k), (k, min(rows, cols))


def keep_ranks(sigmas: list[Tensor], sigma_cutoff: float) -> Tensor:
    """For each layer's singular values (descending), how many lie strictly above
    sigma_cutoff·σ_max (at least 1): one tensor where σ lives, so that a GPU copies the
    ranks of every layer to the host once, not once per layer."""
    return torch.stack([(s > sigma_cutoff * s[0]).sum() for s in sigmas]).clamp_(min=1)


def keep_rank(sigma: Tensor, sigma_cutoff: float) -> int:
    """`keep_ranks` of one layer."""
    return int(keep_ranks([sigma], sigma_cutoff)[0])


def svd(weight: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Thin SVD of the upright matrix view, in float32 whatever the parameter's dtype.

    LAPACK's float32 divide-and-conquer SVD can fail on a well-conditioned matrix (seen with
    MKL on one thread: "Parameter 4 was incorrect on entry to SLASCL", σ between 0.5 and 2):
    such a matrix is decomposed again in float64, deterministically, so every rank holding
    the same weights still gets the same factors.
    """
    m = upright(weight).float()
    try:
        return torch.linalg.svd(m, full_matrices=False)
    except torch.linalg.LinAlgError:
        u, s, vh = torch.linalg.svd(m.double(), full_matrices=False)
        return u.float(), s.float(), vh.float()


def split(
    u: Tensor, s: Tensor, vh: Tensor, k: int, sigma_to: str = "both"
) -> tuple[Tensor, Tensor]:
    """A = U_k Σ_k^½ (max × k), B = Σ_k^½ V_kᵀ (k × min) of the upright matrix; with
    `sigma_to` 'a' or 'b' that factor takes all of Σ_k (A = U_k Σ_k, B = V_kᵀ; or A = U_k,
    B = Σ_k V_kᵀ)."""
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
    A·B is the upright matrix (`upright`): W's matrix view itself, or its transpose for a
    wide layer; `left()` and `right()` are the two factors of the view, out × k and k × in.
    The layer's shape attributes (in_features, out_channels, kernel_size, ...) are copied
    too: model code that reads them from its submodules keeps working after `convert`.

    While the layer is factorised, reading `layer.weight` from outside (a tied decoder, an
    alias, a helper, `getattr`: any path, seen by the survey or not) gives W as the factors
    make it now, A·B, through which the gradient reaches the trained factor: the reader
    trains what the layer trains. The parameter W itself, frozen and stale until the merge,
    is `w`; abtrain's own code uses that.
    """

    def __init__(self, layer: nn.Linear | nn.Conv2d) -> None:
        super().__init__()
        self.is_conv = isinstance(layer, nn.Conv2d)
        for attr in _SHAPE_ATTRS:
            if hasattr(layer, attr):
                setattr(self, attr, getattr(layer, attr))
        self.pad: tuple[tuple[int, ...], str] | None = None
        if self.is_conv:
            padding = layer.padding
            if layer.padding_mode != "zeros":
                # as Conv2d does it: pad with the mode first, then convolve without padding;
                # only the k-channel conv sees the padding, the 1×1 one needs none
                self.pad = (tuple(layer._reversed_padding_repeated_twice), layer.padding_mode)
                padding = 0
            self.conv = dict(stride=layer.stride, padding=padding, dilation=layer.dilation)
        self.weight = layer.weight  # registered: state dicts keep the name
        self.bias = layer.bias
        self.transposed = is_wide(layer.weight.shape)  # A·B is the view's transpose
        empty = torch.empty(0, dtype=layer.weight.dtype, device=layer.weight.device)
        self.a = nn.Parameter(empty.clone(), requires_grad=False)
        self.b = nn.Parameter(empty.clone(), requires_grad=False)
        self.factorized = False

    @property
    def w(self) -> nn.Parameter:
        """W, the parameter: trained at full rank, frozen (and stale) while factorised."""
        return self._parameters["weight"]

    def __getattr__(self, name: str) -> Any:
        # nn.Module keeps parameters out of __dict__, so every read of `weight` comes here
        if name == "weight" and self.__dict__.get("factorized"):
            return self.product()
        return super().__getattr__(name)

    def product(self) -> Tensor:
        """A·B in W's shape, differentiable in the trained factor."""
        return (self.left() @ self.right()).reshape(self.w.shape)

    @property
    def rank(self) -> int:
        return self.a.shape[1] if self.a.dim() == 2 else 0

    def left(self) -> Tensor:
        """The out × k factor of W's matrix view (A, or Bᵀ for a wide layer)."""
        return self.b.t() if self.transposed else self.a

    def right(self) -> Tensor:
        """The k × in·kh·kw factor of W's matrix view (B, or Aᵀ for a wide layer)."""
        return self.a.t() if self.transposed else self.b

    def set_factors(self, a: Tensor, b: Tensor, train: str) -> None:
        """Switch to A·B form, training only `train` ('a' or 'b'). A factor whose shape
        changes becomes a new parameter: an autograd graph a loop kept alive (a loss kept
        in a list) pins the old one's shape, and the next backward would fail on it. The
        optimizer is told by `renew_factors`."""
        for name, value in (("a", a), ("b", b)):
            if getattr(self, name).shape == value.shape:
                getattr(self, name).data = value.contiguous()
            else:
                setattr(self, name, nn.Parameter(value.contiguous(), requires_grad=False))
        self.factorized = True
        self.w.requires_grad_(False)
        self.a.requires_grad_(train == "a")
        self.b.requires_grad_(train == "b")

    def merge(self) -> None:
        """Back to full rank: W = A·B, factors kept (their shapes tell the last rank)."""
        # the product in float32 at least: bfloat16 factors would round it twice
        dtype = torch.promote_types(self.a.dtype, torch.float32)
        with torch.no_grad():
            product = self.a.to(dtype) @ self.b.to(dtype)
            product = product.t() if self.transposed else product
            self.w.copy_(product.reshape(self.w.shape))
        self.factorized = False
        self.w.requires_grad_(True)
        self.a.requires_grad_(False)
        self.b.requires_grad_(False)

    def forward(self, x: Tensor) -> Tensor:
        if not self.is_conv:
            if not self.factorized:
                return F.linear(x, self.w, self.bias)
            return F.linear(F.linear(x, self.right()), self.left(), self.bias)
        if self.pad is not None:
            x = F.pad(x, self.pad[0], mode=self.pad[1])
        if not self.factorized:
            return F.conv2d(x, self.w, self.bias, **self.conv)
        k = self.rank
        right = self.right().reshape(k, *self.w.shape[1:])
        left = self.left().reshape(self.w.shape[0], k, 1, 1)
        return F.conv2d(F.conv2d(x, right, None, **self.conv), left, self.bias)

    def extra_repr(self) -> str:
        kind = "conv" if self.is_conv else "linear"
        return f"{kind} {tuple(self.w.shape)}, rank={self.rank or 'full'}"


_SHAPE_ATTRS = (
    "in_features",
    "out_features",
    "in_channels",
    "out_channels",
    "kernel_size",
    "stride",
    "padding",
    "dilation",
    "groups",
    "padding_mode",
)


@dataclass(frozen=True)
class LayerChoice:
    """One module holding a weight matrix, and whether AB factorises it (if not, why).

    `shape` is the weight's; (rows, cols) its matrix view out × in·kh·kw, at most
    k = min(rows, cols) wide. A lazy weight has no shape yet: (), 0 × 0.
    """

    name: str
    kind: str  # the module's class name
    shape: tuple[int, ...]
    rows: int
    cols: int
    factorised: bool
    reason: str  # why it is kept full rank; "" when factorised

    @property
    def full_rank(self) -> int:
        return min(self.rows, self.cols)

    @property
    def params(self) -> int:
        return math.prod(self.shape) if self.shape else 0


# Reasons a layer is kept full rank whatever ab.full_rank_layers says, checked in order.
def _structural_reason(
    name: str,
    module: nn.Module,
    owners: dict[int, list[str]],
    reads: dict[str, str],
    trained: set[int] | None,
) -> str:
    if not isinstance(module, nn.Linear | nn.Conv2d):
        return "not a Linear/Conv2d"
    if parametrize.is_parametrized(module, "weight") or "weight" not in module._parameters:
        # parametrize or the old weight_norm: W is computed from other parameters
        return "weight computed from other parameters (parametrised)"
    weight = module._parameters["weight"]
    if isinstance(weight, UninitializedParameter):
        return "lazy, not materialised"
    base = nn.Conv2d if isinstance(module, nn.Conv2d) else nn.Linear
    own = [f for f in ("forward", "_conv_forward") if hasattr(base, f)]
    if any(getattr(type(module), f) is not getattr(base, f) for f in own):
        # e.g. timm's Conv2dSame pads by the input's size and StdConv2d standardises W:
        # two plain matmuls/convs would compute something else
        return f"own forward ({type(module).__name__})"
    if name in reads:
        # e.g. MultiheadAttention's forward never calls out_proj but reads its .weight; a
        # tied decoder reads the encoder's: factors trained there would not reach the output
        return f"weight read directly by {reads[name]}"
    if not weight.requires_grad or (trained is not None and id(weight) not in trained):
        return "weight not trained (frozen: requires_grad off, or not in the optimizer)"
    if isinstance(module, nn.Conv2d) and module.groups > 1:
        if module.groups == module.in_channels:
            return "depthwise convolution"
        return f"grouped convolution (groups={module.groups})"
    others = [n for n in owners.get(id(weight), []) if n != f"{name}.weight".lstrip(".")]
    if others:
        # one of several holders replaced would no longer share it; A·B only in one place
        return f"weight shared with {others[0]}"
    if module._forward_hooks or module._forward_pre_hooks:
        return "forward hooks registered on it (a replacement would drop them)"
    if not name:
        return "the model itself (nothing holds it to replace it)"
    return ""


def matches(name: str, pattern: str) -> bool:
    """`pattern` (a glob, case-sensitive) names the module `name` or a module holding it:
    'stem' keeps every layer under stem, 'blocks.*.attn.qkv' one kind of layer per block."""
    parts = name.split(".")
    return any(fnmatch.fnmatchcase(".".join(parts[:i]), pattern) for i in range(len(parts), 0, -1))


def survey(
    model: nn.Module, full_rank_layers: list[str] | None, trained: set[int] | None = None
) -> list[LayerChoice]:
    """Every module holding a weight of 2+ dims (and every Linear/Conv2d), in model order,
    with what AB does with it.

    Factorised: nn.Linear and nn.Conv2d (subclasses too, unless they compute their own
    forward), groups=1, weight a parameter of their own, materialised and not shared.
    Kept too: a layer whose weight other code reads directly (`weight_reads`), and one
    whose weight is not trained (requires_grad off, or, with `trained` the ids of the
    optimizer's parameters, not among them).
    `full_rank_layers` are glob patterns of module names kept as they are; None keeps the
    first and the last factorisable layer (patch embedding / first conv and classifier),
    and every classifier a timm model names (a distilled DeiT's two heads). A pattern that
    names no layer is refused (ConfigError naming it): a typo would otherwise factorise
    the layer it meant. Works on the meta device: shapes only.
    """
    from abtrain.config import ConfigError
    from abtrain.method.weight_reads import read_elsewhere

    reads = read_elsewhere(model)

    owners: dict[int, list[str]] = {}
    for pname, p in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(p), []).append(pname)
    # remove_duplicate=False: a module registered under two names is listed under both,
    # and each sees the other hold its weight
    modules = dict(model.named_modules(remove_duplicate=False))
    found = []
    for name, module in modules.items():
        weight = getattr(module, "weight", None)
        listed = isinstance(module, nn.Linear | nn.Conv2d) or (
            isinstance(weight, nn.Parameter)
            and (isinstance(weight, UninitializedParameter) or weight.dim() >= 2)
        )
        if not listed:
            continue
        if isinstance(module, LowRankLayer):  # converted before: factorised already
            shape = tuple(module.weight.shape)
            found.append([name, "LowRankLayer", shape, shape[0], math.prod(shape[1:]), None])
            continue
        reason = _structural_reason(name, module, owners, reads, trained)
        if isinstance(weight, Tensor) and not isinstance(weight, UninitializedParameter):
            shape = tuple(weight.shape)
            rows, cols = (shape[0], math.prod(shape[1:])) if shape else (0, 0)
        else:
            shape, rows, cols = (), 0, 0
        found.append([name, type(module).__name__, shape, rows, cols, reason])
    candidates = [f for f in found if f[5] == ""]
    if full_rank_layers is None:
        if candidates:
            for f in candidates[1:-1]:
                if any(matches(f[0], head) for head in _timm_classifiers(model)):
                    f[5] = "a classifier head timm names (default)"
            candidates[-1][5] = "last weight layer (default)"
            candidates[0][5] = "first weight layer (default)"
    else:
        unmatched = [p for p in full_rank_layers if not any(matches(f[0], p) for f in found)]
        if unmatched:
            names = ", ".join(f[0] for f in found[:4]) + (", ..." if len(found) > 4 else "")
            raise ConfigError(
                f"ab.full_rank_layers: {unmatched[0]!r} names no layer of the model "
                f"({len(found)} weight layers: {names}; `python -m abtrain check --layers` "
                "lists them)"
            )
        for f in candidates:
            pattern = next((p for p in full_rank_layers if matches(f[0], p)), None)
            if pattern is not None:
                f[5] = f"ab.full_rank_layers: {pattern!r}"
    return [
        LayerChoice(name, kind, shape, rows, cols, not reason, reason or "")
        for name, kind, shape, rows, cols, reason in found
    ]


def _timm_classifiers(model: nn.Module) -> tuple[str, ...]:
    """The classifier layers a timm model's own config names (e.g. a distilled DeiT's
    ('head', 'head_dist')); () for other models."""
    cfg = getattr(model, "pretrained_cfg", None)
    heads = cfg.get("classifier") if isinstance(cfg, dict) else None
    return (heads,) if isinstance(heads, str) else tuple(heads or ())


def kept_full_rank(choices: list[LayerChoice]) -> dict[str, str]:
    """{layer: why it is kept full rank} of a survey."""
    return {c.name: c.reason for c in choices if not c.factorised}


def why_kept(choices: list[LayerChoice], shown: int = 4) -> str:
    """The layers kept full rank and why, on one line (the first `shown` of them)."""
    kept = kept_full_rank(choices)
    why = "; ".join(f"{n or '(model)'}: {r}" for n, r in list(kept.items())[:shown])
    more = f"; {len(kept) - shown} more" if len(kept) > shown else ""
    return (why or "the model has no weight layer") + more


def replace(model: nn.Module, choices: list[LayerChoice]) -> dict[str, LowRankLayer]:
    """Replace each layer the survey factorises by a LowRankLayer, in place."""
    layers = {}
    for c in choices:
        if not c.factorised:
            continue
        parent_name, _, child = c.name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        layer = LowRankLayer(getattr(parent, child))
        setattr(parent, child, layer)
        layers[c.name] = layer
    return layers


def convert(model: nn.Module, full_rank_layers: list[str] | None) -> dict[str, LowRankLayer]:
    """Replace every layer `survey` factorises by a LowRankLayer, in place."""
    return replace(model, survey(model, full_rank_layers))


def low_rank_layers(model: nn.Module) -> dict[str, LowRankLayer]:
    return {n: m for n, m in model.named_modules() if isinstance(m, LowRankLayer)}


def parameter_counts(model: nn.Module) -> tuple[int, int]:
    """(full-rank count, current count) over every parameter, biases and tokens included.

    A layer counts as A+B once it has been factorised (its last factorisation), as W before.
    """
    full = current = 0
    seen = set()
    for layer in low_rank_layers(model).values():
        w = layer.w.numel()
        full += w
        current += layer.a.numel() + layer.b.numel() if layer.rank else w
        seen.update({id(layer.w), id(layer.a), id(layer.b)})
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


def renew_factors(
    opt: torch.optim.Optimizer,
    before: dict[str, tuple[nn.Parameter, nn.Parameter]],
    layers: dict[str, LowRankLayer],
) -> None:
    """Where a factorisation made new factor parameters (`set_factors`, on a change of
    shape), the optimizer takes the new ones in the old ones' place, with their state."""
    swap = {
        id(old): (old, new)
        for name, layer in layers.items()
        for old, new in zip(before[name], (layer.a, layer.b))
        if old is not new
    }
    if not swap:
        return
    for group in opt.param_groups:
        group["params"] = [swap[id(p)][1] if id(p) in swap else p for p in group["params"]]
    for old, new in swap.values():
        if old in opt.state:
            opt.state[new] = opt.state.pop(old)


def adapt_optimizer_state(
    opt: torch.optim.Optimizer, layers: dict[str, LowRankLayer], mode: str
) -> None:
    """The optimizer's per-parameter tensors across a change of shape (AdamW's moments,
    SGD's momentum, any optimizer's): carried (cut or zero-padded) or reset. Scalars (a
    step count) stay."""
    for layer in layers.values():
        for p in (layer.w, layer.a, layer.b):
            state = opt.state.get(p)
            if not state:
                continue
            if mode == "reset":
                del opt.state[p]
                continue
            for key, value in state.items():
                if torch.is_tensor(value) and value.dim() and value.shape != p.shape:
                    state[key] = fit_shape(value, p.shape)
