"""A user's model factory named in the config, "package.module:function": its form alone,
read without importing torch (the config checks it; abtrain.models.factory imports it)."""

from __future__ import annotations

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
