"""abtrain: AB training (Coquelin et al.) and its baselines, with exact traffic accounting.

The method in any training loop (see examples/ab_loop.py):

    cfg = abtrain.load_config("params.yaml")        # method, steps, ab, powersgd, dist
    ab = abtrain.ABTraining(model, optimizer, cfg)  # after init_process_group
    for step in range(cfg.steps):
        net = ab.module(step)                       # phase changes, A/B groups, syncs
        lr = my_lr(step) * ab.lr_factor(step)       # the rebound after each change
        ...forward with net, backward, optimizer.step()...
    model = ab.finish()                             # merged, full rank
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from abtrain.abtraining import ABTraining
    from abtrain.config import Config, ConfigError
    from abtrain.config import load as load_config

__all__ = ["ABTraining", "Config", "ConfigError", "load_config"]


def __getattr__(name: str) -> Any:
    # torch loads only when the method is asked for: `python -m abtrain --help` and
    # `compare` stay quick
    if name == "ABTraining":
        from abtrain.abtraining import ABTraining

        return ABTraining
    if name in ("Config", "ConfigError", "load_config"):
        from abtrain import config

        return getattr(config, "load" if name == "load_config" else name)
    raise AttributeError(f"module 'abtrain' has no attribute {name!r}")
