"""Models from outside abtrain: a timm architecture by name, or a user's own factory.

timm is imported only here and only when such a model is asked for: it takes seconds to
import, and the runs on synthetic data (the tests' MLP) need none of it.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from torch import nn

from abtrain.errors import ConfigError
from abtrain.modelspec import split_spec, timm_arch_problem


def timm_model(arch: str, classes: int, kwargs: dict[str, Any]) -> nn.Module:
    """timm.create_model with random weights: pretrained=False, so nothing is downloaded."""
    import timm

    problem = timm_arch_problem(arch)
    if problem:
        raise ConfigError(f"model.arch: {problem}")
    try:
        return timm.create_model(arch, pretrained=False, num_classes=classes, **kwargs)
    except Exception as err:
        # an argument the architecture doesn't take: a TypeError from most, but a KeyError
        # or ValueError from some (MLP-Mixer's builder); told apart from a failure of the
        # architecture itself by building it once without them
        if not kwargs or not _builds(arch, classes):
            raise
        cause = f"{type(err).__name__}: {err}" if not isinstance(err, TypeError) else str(err)
        raise ConfigError(f"model.kwargs: timm's {arch} refused its arguments: {cause}") from err


def _builds(arch: str, classes: int) -> bool:
    import timm
    import torch

    try:
        with torch.device("meta"):
            timm.create_model(arch, pretrained=False, num_classes=classes)
    except Exception:
        return False
    return True


class NotHere(ConfigError):
    """A factory's module this process can't import: a launcher's node may lack what the
    compute nodes have, so this one is left for the ranks to report."""


def resolve(spec: str) -> Any:
    """The callable named by 'package.module:function', imported now (ConfigError naming
    model.factory if it can't be)."""
    try:
        module_name, attr = split_spec(spec)
    except ValueError as err:
        raise ConfigError(f"model.factory: {err}") from None
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as err:  # a missing module, or one that fails as it is imported
        raise NotHere(
            f"model.factory: cannot import module {module_name!r} ({type(err).__name__}: {err});"
            f" it must be installed or on PYTHONPATH on every node"
        ) from err
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"model.factory: module {module_name!r} has no function {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(
            f"model.factory: {attr!r} in module {module_name!r} is a {type(obj).__name__}, "
            f"not a function or class"
        )
    return obj


def python_model(spec: str, classes: int, kwargs: dict[str, Any]) -> nn.Module:
    """`spec`'s function called as function(num_classes=classes, **kwargs)."""
    fn = resolve(spec)
    try:
        inspect.signature(fn).bind(num_classes=classes, **kwargs)
    except TypeError as err:  # checked before the call: a TypeError raised inside the
        # factory is a bug in it, not a wrong argument, and keeps its own traceback
        raise ConfigError(
            f"model.kwargs: {spec} does not take these arguments (it is called with "
            f"num_classes and model.kwargs): {err}"
        ) from None
    except ValueError:  # no signature to check (some builtins): the call will tell
        pass
    model = fn(num_classes=classes, **kwargs)
    if not isinstance(model, nn.Module):
        raise ConfigError(
            f"model.factory: {spec} returned {type(model).__name__}, not a torch.nn.Module"
        )
    return model
