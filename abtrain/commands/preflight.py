"""What can be refused before any process starts, in one line naming the key, file or rank:
the data a run reads, the batch against the training set, the model the config builds (and,
under an AB method, that it leaves AB a layer to factorise), the world's groups, the run
folder and the tracking store. `train` asks on every rank; the launcher and a SLURM stage
ask once, before any torchrun (`refusal`); `check` reports the same."""

from __future__ import annotations

import argparse
import json
import os
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from abtrain.config import ConfigError

if TYPE_CHECKING:
    from torch import nn

    from abtrain.config import Config
    from abtrain.method.lowrank import LayerChoice


def check_batch(cfg, world_size: int) -> list[str]:
    """Refuse a global batch larger than the training set; returns notes for the user."""
    if cfg.data.name == "synthetic":
        n, origin = cfg.data.train_samples, "data.train_samples"
    else:
        from abtrain.data.prepare import train_size

        n, origin = train_size(cfg.data)
    if n is None:
        return [f"batch_size not checked against the training set: {origin} (run prepare)"]
    if cfg.batch_size * world_size > n:
        raise ConfigError(
            f"batch_size={cfg.batch_size} on {world_size} ranks is a global batch of "
            f"{cfg.batch_size * world_size}, more than the {n} training samples ({origin})"
        )
    return []


def model_shape(cfg: Config) -> tuple[int, int, str | None]:
    """(classes, features) the config's model is built with, as the trainer's task will
    have them, and a note where the classes are assumed (data not prepared yet)."""
    d = cfg.data
    if d.name == "synthetic":
        return d.classes, d.features, None
    known = {"cifar10": 10, "cifar100": 100}
    if d.name in known:
        return known[d.name], 0, None
    try:  # the classes `prepare` found
        meta = json.loads((Path(d.prepared) / "meta.json").read_text())
        return len(meta["classes"]), 0, None
    except (OSError, ValueError, KeyError, TypeError):
        assumed = 1000
        return assumed, 0, f"data.prepared holds no classes yet (run prepare): assumed {assumed}"


def build_model(cfg: Config, classes: int, features: int) -> nn.Module:
    """The config's model, on the meta device where it builds there (shapes only: fast for
    any size), else on the CPU; the global RNG is left as it was."""
    import torch

    from abtrain import models

    with torch.random.fork_rng(devices=[]):  # build() seeds the global generator
        try:
            with torch.device("meta"):
                return models.build(cfg, classes, features)
        except Exception:  # a model whose construction reads values (.item(), numpy)
            return models.build(cfg, classes, features)


def _label(cfg: Config) -> str:
    from abtrain.models import label

    return label(cfg.model)


def check_model(cfg: Config, model: nn.Module) -> tuple[list[LayerChoice], list[str]]:
    """Survey the config's model as AB would convert it: (lowrank.survey, notes). Under an
    AB method, a model with no layer to factorise is refused (ConfigError), as is a
    pattern of ab.full_rank_layers that names no layer."""
    from abtrain.method import lowrank, methods

    notes = [n for n in model_shape(cfg)[2:] if n]
    ab = methods.kind(cfg.method).low_rank
    try:
        choices = lowrank.survey(model, cfg.ab.full_rank_layers)
    except ConfigError as err:
        if ab:
            raise
        notes.append(f"{err} (ignored: {cfg.method} factorises nothing)")
        choices = lowrank.survey(model, None)
    if ab and not any(c.factorised for c in choices):
        kept = lowrank.kept_full_rank(choices)
        chosen = any("(default)" in r or "full_rank_layers" in r for r in kept.values())
        hint = "; ab.full_rank_layers: [] would factorise those it keeps" if chosen else ""
        raise ConfigError(
            f"model {_label(cfg)}: no layer for {cfg.method} to factorise, every weight "
            f"layer is kept full rank ({lowrank.why_kept(choices)}){hint}"
        )
    return choices, notes


def refuse_model(cfg: Config) -> None:
    """Before any process starts, refuse (ConfigError) a model the config can't build
    (an architecture or arguments it names wrongly) and, under an AB method, one with no
    layer to factorise. A factory this process can't import (the compute nodes may have
    it) and a model that fails in its own code are let through: the ranks report those."""
    from abtrain.models.factory import NotHere

    classes, features, _ = model_shape(cfg)
    try:
        model = build_model(cfg, classes, features)
    except NotHere:
        return
    except ConfigError:
        raise
    except Exception:
        return
    from abtrain.method import methods

    if methods.kind(cfg.method).low_rank:
        check_model(cfg, model)


def refusal(args: Sequence[str], world_size: int, ranks_per_node: int) -> str | None:
    """Why `python -m abtrain ARGS` on `world_size` ranks would be refused before training,
    said once here in one line rather than by every rank after torchrun started them all:
    arguments the command doesn't take, a `train` whose config can't be read or is invalid,
    whose method can't form its groups on this world or whose global batch exceeds the
    training set (the checks each rank makes again), or whose model leaves its AB method no
    layer to factorise. None when it may start, or when it can't be told here (a model that
    doesn't build in this process: the ranks report that themselves)."""
    # imported here: the launcher needs torch only to build the model it checks
    from abtrain.commands.cli import build_parser
    from abtrain.config import ConfigError, load, one_line
    from abtrain.method.methods import check_world

    class Refusing(argparse.ArgumentParser):  # argparse's error as a value, not an exit
        def error(self, message: str) -> typing.NoReturn:
            raise ConfigError(f"python -m abtrain: {message}")

    try:
        ns = build_parser(Refusing).parse_args(list(args))
        if ns.command == "train":
            cfg = load(ns.config, ns.overrides)
            check_world(cfg, world_size, ranks_per_node)
            refuse_model(cfg)
            if cfg.data.name != "synthetic":  # else every rank fails on it after starting
                from abtrain.data.datasets import unprepared

                if (why := unprepared(cfg.data)) is not None:
                    raise ConfigError(f"data.prepared: {why}")
            check_batch(cfg, world_size)
            if cfg.tracking.enabled:
                from abtrain.tracking.tracker import damaged_store, default_uri

                if (why := damaged_store(cfg.tracking.uri or default_uri())) is not None:
                    raise ConfigError(f"tracking.uri: {why}")
            writable(Path(ns.out))
    except ConfigError as err:
        return one_line(err)
    return None


def writable(out: Path) -> None:
    """The run folder can be written (a read-only mount, a folder of another user's), tried
    by writing there; else a ConfigError naming it."""
    from abtrain.config import ConfigError

    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".abtrain-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise ConfigError(
            f"--out {out}: the run can't write there ({err.strerror or err}); choose another folder"
        ) from None


def data_classes(cfg) -> tuple[int, str]:
    """How many classes the config's data set has, and where that number comes from."""
    d = cfg.data
    if d.name == "synthetic":
        return d.classes, "data.classes"
    known = {"cifar10": 10, "cifar100": 100, "imagenet": 1000}
    meta = Path(d.prepared) / "meta.json"
    if meta.exists():
        classes = json.loads(meta.read_text()).get("classes")
        if classes:
            return len(classes), str(meta)
    if d.name in known:
        return known[d.name], f"data.name={d.name}"
    raise ConfigError(
        f"the number of classes of data.name={d.name} is in {meta}, which does not exist: "
        f"run `python -m abtrain prepare --config ...` or pass --classes N"
    )
