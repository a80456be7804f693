"""abtrain: AB training (Coquelin et al.) and its baselines, with exact traffic accounting.

The method in any training loop (see examples/ab_loop.py), no config file needed:

    ab = abtrain.ABTraining(model, optimizer, steps=N)  # after init_process_group
    for step in range(N):
        net = ab.module(step)                       # phase changes, A/B groups, syncs
        lr = my_lr(step) * ab.lr_factor(step)       # the rebound after each change
        ...forward with net, backward, optimizer.step()...
    model = ab.finish()                             # merged, full rank

`steps=N` alone takes the paper's guidelines (`abtrain.method.guidelines`: warm-up 20% of the
steps, AB phases 3.33%, ...); any of them by keyword (`sigma_cutoff=0.3`), or a config:
`abtrain.method_config(steps=N, ...)`, `abtrain.load_config("ab.yaml")`.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from abtrain.config import Config, ConfigError, MethodConfig
    from abtrain.method.abtraining import ABTraining
    from abtrain.method.guidelines import load_config, method_config

__all__ = ["ABTraining", "Config", "ConfigError", "MethodConfig", "load_config", "method_config"]


def __getattr__(name: str) -> Any:
    # torch loads only when the method is asked for: `python -m abtrain --help` and
    # `compare` stay quick
    if name == "ABTraining":
        from abtrain.method.abtraining import ABTraining

        return ABTraining
    if name in ("Config", "ConfigError", "MethodConfig"):
        from abtrain import config

        return getattr(config, name)
    if name in ("load_config", "method_config"):
        from abtrain.method import guidelines

        return getattr(guidelines, name)
    raise AttributeError(f"module 'abtrain' has no attribute {name!r}")
