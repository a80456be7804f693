"""The method's settings for a loop that brings no config file: the paper's guidelines.

`method_config(steps=N)` is all a user's loop needs; every key it is not given takes the
value published for it, here and nowhere else in the library (the pipeline's params.yaml
states every value it runs with and reads none of these):

- the schedule, from the paper's search (Coquelin et al., section 4.3): a full-rank warm-up
  of 20% of the steps, AB phases of 3.33% of them, a full-rank rebound of 0.25 of an AB
  phase and a learning-rate rebound of 0.5 of one; the rebounds follow the AB phase
  actually used, so `ab_steps=50` alone gives rebounds of 12 and 25 steps;
- the rank cut-off 0.15, the value of the authors' published ImageNet configs;
- the paper's sync (A and B averaged with the stale factor, `with_stale`), A/B groups of one
  node, the first and last weight layer kept full rank, the optimizer's moments carried
  across shapes: what its Algorithm 1 describes;
- PowerSGD (not part of the paper): torch's own `PowerSGDState` defaults;
- local SGD and DiLoCo (not part of the paper): the warm-up and the period of AB's own
  schedule (20% of the steps of full-rank DDP, then an average every 3.33% of them), so
  that by default they differ from AB in what crosses between nodes, not when; DiLoCo's
  outer step as Douillard et al. (2023) publish it: SGD, learning rate 0.7, Nesterov
  momentum 0.9 (their 500 inner steps are longer than most of abtrain's runs);
- buckets and BatchNorm as plain DDP has them (25 MB; each rank's own statistics).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from abtrain import config
from abtrain.config import ABConfig, Config, ConfigError, MethodConfig

WARMUP_SHARE = 0.2  # warmupSteps: 20% of the total training steps
AB_PHASE_SHARE = 1 / 30  # numABSteps: 3.33% of the total training steps
REBOUND_PER_AB_PHASE = 0.25  # fullRankReboundSteps: 0.25 · numABSteps
LR_REBOUND_PER_AB_PHASE = 0.5  # learning-rate rebound steps: 0.5 · numABSteps

AB = dict(
    phase_rule="algorithm1",
    lr_rebound="abtrain",  # the scheduled LR times a ramp (the paper gives its length only)
    sigma_cutoff=0.15,
    split_sigma=True,
    sync_mode="with_stale",
    group_size=None,  # the ranks of one node
    full_rank_layers=None,  # the first and the last weight layer
    optimizer_state="carry",
)
POWERSGD = dict(rank=1, start_iter=1000, error_feedback=True, warm_start=True)  # torch's
DILOCO_OUTER = dict(outer_lr=0.7, outer_momentum=0.9)  # Douillard et al. 2023, section 3
LOCAL = ("localsgd", "diloco")  # the sections of the methods whose nodes train on their own
DIST = dict(backend="auto", timeout_s=1800, bucket_cap_mb=25.0, sync_batchnorm="local")
SCHEDULE = ("warmup_steps", "ab_steps", "rebound_steps", "lr_rebound_steps")


def schedule(steps: int, ab_steps: int | None = None) -> dict[str, int]:
    """The guideline schedule of a run of `steps` steps (of an AB phase of `ab_steps`, if
    given): each count rounded, an AB phase and the rebounds at least one step."""
    phase = ab_steps if ab_steps is not None else max(1, round(AB_PHASE_SHARE * steps))
    return dict(
        warmup_steps=round(WARMUP_SHARE * steps),
        ab_steps=phase,
        rebound_steps=max(1, round(REBOUND_PER_AB_PHASE * phase)),
        lr_rebound_steps=max(1, round(LR_REBOUND_PER_AB_PHASE * phase)),
    )


def local_schedule(steps: int) -> dict[str, int]:
    """Local SGD's and DiLoCo's guideline warm-up and period: AB's (`schedule`)."""
    ab = schedule(steps)
    return dict(warmup_steps=ab["warmup_steps"], period=ab["ab_steps"])


def method_config(
    steps: int,
    method: str = "ab",
    seed: int = 0,
    powersgd: Mapping[str, Any] | None = None,
    dist: Mapping[str, Any] | None = None,
    localsgd: Mapping[str, Any] | None = None,
    diloco: Mapping[str, Any] | None = None,
    **ab: Any,
) -> MethodConfig:
    """The method's settings for a run of `steps` steps: the guidelines above, with any of
    them given by keyword. `ab`'s keys are keywords of their own (`sigma_cutoff=0.3`,
    `warmup_steps=100`, `group_size=1`...); the other sections' go in a mapping
    (`powersgd={"rank": 4}`, `diloco={"period": 50}`, `dist={"sync_batchnorm": "group"}`).
    A key it does not know is refused (ConfigError naming it and the closest it knows)."""
    if not isinstance(steps, int) or isinstance(steps, bool) or steps <= 0:
        raise ConfigError(f"steps: {steps!r} is not a positive whole number of steps")
    _known("", ab, ABConfig.model_fields)
    _known("powersgd", powersgd or {}, POWERSGD)
    _known("dist", dist or {}, DIST)
    _known("localsgd", localsgd or {}, {**local_schedule(steps), "schedule": "own"})
    _known("diloco", diloco or {}, {**local_schedule(steps), **DILOCO_OUTER})
    given_schedule = {k: ab[k] for k in SCHEDULE if k in ab}
    ab_steps = given_schedule.get("ab_steps")
    derived = schedule(steps, ab_steps if isinstance(ab_steps, int) else None)
    return MethodConfig(
        method=method,
        seed=seed,
        steps=steps,
        ab={**AB, **derived, **ab},
        powersgd={**POWERSGD, **(powersgd or {})},
        localsgd={**local_schedule(steps), "schedule": "own", **(localsgd or {})},
        diloco={**local_schedule(steps), **DILOCO_OUTER, **(diloco or {})},
        dist={**DIST, **(dist or {})},
    )


def from_mapping(raw: Mapping[str, Any]) -> MethodConfig:
    """A method config from a mapping of the method's keys (a YAML file's), the sections
    nested as in params.yaml; what it lacks takes the guidelines. `steps` is required."""
    if "steps" not in raw:
        raise ConfigError("steps: required (the guidelines' schedule is a share of it)")
    for section in ("ab", "powersgd", "dist", *LOCAL):
        if not isinstance(raw.get(section) or {}, Mapping):
            raise ConfigError(f"{section}: must be a mapping of its keys")
    top = {k: v for k, v in raw.items() if k in ("method", "seed")}
    return method_config(
        raw["steps"],
        **top,
        powersgd=raw.get("powersgd"),
        dist=raw.get("dist"),
        localsgd=raw.get("localsgd"),
        diloco=raw.get("diloco"),
        **(raw.get("ab") or {}),
    )


def _known(section: str, given: Mapping[str, Any], known: Mapping[str, Any]) -> None:
    for key in given:
        if key not in known:
            close = difflib.get_close_matches(key, list(known), n=3)
            where = f"{section}." if section else "ab."
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ConfigError(
                f"{where}{key}: not a setting of the method{hint}; it knows {', '.join(known)}"
            )


def load_config(
    path: str | Path, overrides: list[str] = (), section: str = "train"
) -> Config | MethodConfig:
    """`abtrain.load_config`: a file of a whole run gives a `Config` (abtrain.config.load,
    every key required); a file holding only the method's keys (method, steps, seed, ab,
    powersgd, localsgd, diloco, dist: what `ABTraining` reads) a `MethodConfig` whose missing keys take the
    guidelines. `overrides`: `key=value`, as `--set` takes them."""
    path = Path(path)
    raw = config.read_mapping(path, section)
    if not set(raw) <= set(config.METHOD_KEYS):
        return config.load(path, overrides, section)
    try:
        return from_mapping(config.apply_overrides(raw, list(overrides), free=True))
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None


def settle(cfg: Any, given: Mapping[str, Any]) -> MethodConfig:
    """What `ABTraining` runs with: `cfg` (a MethodConfig or Config, a file's path, or None:
    the guidelines) with the keywords `given` (steps, method, seed, and `ab`'s keys) over
    it. Over a given config a keyword replaces that one value; nothing is derived again."""
    given = {k: v for k, v in given.items() if v is not None}
    if cfg is None:
        if "steps" not in given:
            raise ConfigError(
                "ABTraining needs the run's length, steps=N (the schedule is the paper's "
                "guidelines as shares of it), or a config (abtrain.method_config, a file)"
            )
        return method_config(**given)
    if isinstance(cfg, str | Path):
        cfg = load_config(cfg)
    if not isinstance(cfg, MethodConfig):
        raise ConfigError(
            f"ABTraining's config is a {type(cfg).__name__}; give an abtrain.MethodConfig "
            "(abtrain.method_config(steps=N, ...)), a Config, or a YAML file's path"
        )
    if not given:
        return cfg
    top = {k: given.pop(k) for k in ("steps", "method", "seed") if k in given}
    _known("", given, ABConfig.model_fields)
    raw = cfg.dump()
    raw.update(top)
    raw["ab"].update(given)
    return config.validate(type(cfg), raw)
