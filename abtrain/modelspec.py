"""What names a model in the config, checked without building it: a user's factory's form,
"package.module:function" (read without importing torch), and a timm architecture's name
(the config checks both; abtrain.models.factory builds them)."""

from __future__ import annotations

import difflib
import re


def split_spec(factory: str) -> tuple[str, str]:
    """'pkg.module:function' -> ('pkg.module', 'function'); ValueError for anything else.
    After the colon a dotted path may reach into a class (module:Class.method)."""
    name = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
    match = re.fullmatch(rf"\s*({name}):({name})\s*", factory)
    if not match:
        raise ValueError(
            f"{factory!r} is not of the form 'package.module:function' (a module to "
            f"import, a colon, the function or class in it that builds the model)"
        )
    return match[1], match[2]


def timm_arch_problem(arch: str) -> str | None:
    """Why timm has no architecture `arch` (with the closest names it has), or None."""
    import timm

    if timm.is_model(arch):
        return None
    close = difflib.get_close_matches(arch, timm.list_models(), n=8, cutoff=0.6)
    hint = f"the closest: {', '.join(close)}" if close else "see timm.list_models()"
    return f"timm has no architecture {arch!r} ({hint})"


def check_timm_arch(arch: str) -> None:
    """ValueError (for the config's validation, which names the key) if timm lacks `arch`."""
    problem = timm_arch_problem(arch)
    if problem:
        raise ValueError(problem)
