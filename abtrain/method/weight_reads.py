"""Which layers' weights a model's code reads outside the layer's own forward.

A tied autoencoder's decoder (`F.linear(z, self.enc.weight.t())`), a weight-tied LM head,
torch's MultiheadAttention (`self.out_proj.weight`): such code reads W itself, so in an AB
phase it would see a stale W that no gradient reaches, while the layer computes with A·B.
AB keeps those layers full rank. They are found from the code the model runs, not from
names: the source of each module's `forward` and of every method of its own it calls
(`self.forward_features(x)`), read for `self.<submodule path>.weight` used as a value.
Reading only what describes W (`.dtype`, `.shape`, ...) is no use of its values and is
left alone. Not seen: a weight reached through `getattr`, a variable index or code without
source; such a layer belongs in `ab.full_rank_layers`.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap

from torch import nn

# attributes that describe a tensor rather than use its values
_DESCRIBES = frozenset(
    {"dtype", "device", "shape", "size", "ndim", "dim", "requires_grad", "is_cuda", "numel"}
)


def read_elsewhere(model: nn.Module) -> dict[str, str]:
    """{layer name: "Class.method" of the first code found reading its weight} for every
    module whose `weight` the code of another module (an ancestor) reads."""
    out: dict[str, str] = {}
    for name, module in model.named_modules():
        for chain, where in _weight_reads(type(module)):
            target = ".".join(filter(None, (name, *chain)))
            try:
                model.get_submodule(target)
            except AttributeError:
                continue
            out.setdefault(target, where)
    return out


@functools.cache
def _weight_reads(cls: type) -> tuple[tuple[tuple[str, ...], str], ...]:
    """(submodule path, "Class.method") of each `self.<path>.weight` read as a value in
    `cls.forward` and the methods of `cls` it calls on `self`, transitively. A path of ()
    (a layer reading its own weight) is left out."""
    found: list[tuple[tuple[str, ...], str]] = []
    todo, seen = ["forward"], set()
    while todo:
        method = todo.pop()
        if method in seen:
            continue
        seen.add(method)
        tree = _parse(cls, method)
        if tree is None:
            continue
        where = f"{cls.__name__}.{method}"
        parents = {id(c): p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "weight":
                chain = _self_path(node.value)
                parent = parents.get(id(node))
                described = isinstance(parent, ast.Attribute) and parent.attr in _DESCRIBES
                if chain and not described:
                    found.append((chain, where))
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and _self_path(node.func.value) == ()
                and inspect.isfunction(getattr(cls, node.func.attr, None))
            ):
                todo.append(node.func.attr)
    return tuple(found)


def _self_path(node: ast.AST) -> tuple[str, ...] | None:
    """`self.a.b` -> ('a', 'b'), `self.a[0]` -> ('a', '0'); `self` -> (); else None."""
    parts: list[str] = []
    while True:
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            parts.append(str(node.slice.value))  # self.blocks[0]: submodule "blocks.0"
        else:
            break
        node = node.value
    if isinstance(node, ast.Name) and node.id == "self":
        return tuple(reversed(parts))
    return None


def _parse(cls: type, method: str) -> ast.AST | None:
    fn = getattr(cls, method, None)
    if not inspect.isfunction(fn):
        return None
    try:
        return ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):  # no source to read (built at run time)
        return None
