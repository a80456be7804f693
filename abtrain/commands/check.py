"""`python -m abtrain check`: a config, the world it runs on and its model's weight layers
(which AB factorises, their shapes, or why each is kept full rank), before anyone trains;
what it refuses is what `train` and the launcher refuse (abtrain.commands.preflight)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from abtrain.commands.preflight import _label, build_model, check_batch, check_model, model_shape
from abtrain.config import ConfigError

if TYPE_CHECKING:
    from torch import nn

    from abtrain.config import Config
    from abtrain.method.lowrank import LayerChoice

# torch loads only where a model is built: `check_batch` serves `train` before torchrun


def layer_table(choices: list[LayerChoice], model: nn.Module) -> list[str]:
    """The survey as a table: each weight layer's kind, weight shape, matrix rows x cols
    and parameters (W; A = rows*k and B = k*cols at k = min(rows, cols), the most an AB
    phase holds) or why it is kept full rank; then the totals."""
    rows = [("layer", "kind", "weight", "matrix", "W", "A", "B")]
    for c in choices:
        weight = "x".join(map(str, c.shape)) if c.shape else "?"
        matrix = f"{c.rows}x{c.cols}" if c.shape else "?"
        w = f"{c.params:,}" if c.shape else "?"
        k = c.full_rank
        ab = (f"{c.rows * k:,}", f"{k * c.cols:,}") if c.factorised else ("", "")
        rows.append((c.name or "(model)", c.kind, weight, matrix, w, *ab))
    width = [max(len(r[i]) for r in rows) for i in range(7)]
    lines = []
    for r, c in zip(rows, [None, *choices]):
        left = "  ".join(r[i].ljust(width[i]) for i in range(4))
        line = f"{left}  {r[4].rjust(width[4])}"
        if c is None or c.factorised:
            line += f"  {r[5].rjust(width[5])}  {r[6].rjust(width[6])}"
        else:
            line += f"  kept: {c.reason}"
        lines.append(line.rstrip())
    # each parameter tensor once: a weight shared by two layers, or by a layer and an
    # embedding, is counted where it first appears, so the four lines add up to the total
    params = {id(p): p.numel() for p in model.parameters()}
    counted: set[int] = set()
    held = {True: 0, False: 0}
    for c in choices:
        module = model.get_submodule(c.name) if c.name else model
        w = module._parameters.get("weight")
        if w is not None and id(w) in params and id(w) not in counted and c.shape:
            counted.add(id(w))
            held[c.factorised] += params[id(w)]
    done = [c for c in choices if c.factorised]
    a = sum(c.rows * c.full_rank for c in done)
    b = sum(c.full_rank * c.cols for c in done)
    total = sum(params.values())
    lines += [
        f"factorised: {_count(len(done), 'layer')}, {held[True]:,} parameters "
        f"(A {a:,} + B {b:,} at full rank)",
        f"kept full rank: {_count(len(choices) - len(done), 'layer')}, {held[False]:,} parameters",
        f"other parameters (biases, norms, tokens): {total - held[True] - held[False]:,}",
        f"total: {total:,} parameters",
        "A = rows x k, B = k x cols at the full rank k = min(rows, cols), the most AB holds",
    ]
    return lines


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'s' * (n != 1)}"


def survey_line(cfg: Config, choices: list[LayerChoice]) -> str:
    """One line on the model's weight layers, and the reasons some are kept full rank."""
    kept = [c for c in choices if not c.factorised]
    reasons: dict[str, int] = {}
    for c in kept:
        reasons[c.reason] = reasons.get(c.reason, 0) + 1
    why = [f"{r} x{n}" if n > 1 else r for r, n in reasons.items()]
    lines = [
        f"model {_label(cfg)}: {len(choices)} weight layers, "
        f"{len(choices) - len(kept)} factorised by AB, {len(kept)} kept full rank"
        + (":" if why else "")
    ]
    for i, reason in enumerate(why):  # wrapped at 100 columns between reasons
        item = reason + (";" if i < len(why) - 1 else "")
        if len(lines) > 1 and len(lines[-1]) + 1 + len(item) <= 100:
            lines[-1] += " " + item
        else:
            lines.append("  " + item)
    return "\n".join(lines)


def run_check(
    cfg: Config, path: str, world_size: int | None, ranks_per_node: int | None, layers: bool = False
) -> int:
    from abtrain.method import methods

    notes = []
    if world_size is None:
        world_size, ranks_per_node = methods.make(cfg.method).smallest_world(cfg, ranks_per_node)
        notes.append(
            f"no --world-size: checked on the fewest ranks {cfg.method} runs on, "
            f"{world_size // ranks_per_node} node(s) x {ranks_per_node}; "
            "pass --world-size N --ranks-per-node M to check a cluster"
        )
    elif ranks_per_node is None:
        ranks_per_node = world_size
        notes.append(f"no --ranks-per-node: checked as one node of {world_size} ranks")
    try:
        methods.check_world(cfg, world_size, ranks_per_node)
    except ConfigError as err:
        raise ConfigError(f"{err} ({'; '.join(notes)})" if notes else str(err)) from None
    notes += check_batch(cfg, world_size)
    if cfg.data.name != "synthetic" and (Path(cfg.data.prepared) / "meta.json").exists():
        from abtrain.data.prepare import problem  # prepared, but perhaps damaged since

        if (why := problem(cfg.data)) is not None:
            raise ConfigError(f"data.prepared: {why}")
    classes, features, _ = model_shape(cfg)
    try:
        model = build_model(cfg, classes, features)
    except ConfigError:
        raise
    except Exception as err:  # the config's own model: its error is the config's
        raise ConfigError(
            f"model {_label(cfg)}: could not be built: {type(err).__name__}: {err}"
        ) from None
    choices, model_notes = check_model(cfg, model)
    notes += model_notes
    print(f"{path}: valid ({cfg.method}, {world_size} ranks)")
    if not methods.kind(cfg.method).low_rank:
        notes.append(f"{cfg.method} trains every layer full rank; the layers are as AB's")
    print(survey_line(cfg, choices))
    if layers:
        print("\n".join(layer_table(choices, model)))
    else:
        notes.append("--layers lists each weight layer with its shapes and parameters")
    for note in notes:
        print(f"note: {note}")
    return 0
