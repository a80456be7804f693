"""What every stage and study shares: params.yaml and the paths of what the stages
write, a stage's command line and its one-line errors, a folder moved aside."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from abtrain import config as abconfig
from abtrain.config import one_line
from abtrain.files import RecordError
from abtrain.lifetime import die_with_runner
from search import space

PARAMS = Path("params.yaml")
RUNS = Path("runs")
# Each search's record (best.json, evaluations.jsonl): small, committed, and what the runs
# train from, so a fresh clone trains the committed runs instead of a search that timing moves.
SEARCHES = Path("results/search")
DATA_COUNTS = Path("results/data/counts.json")  # each prepared data set's image counts (prepare)


def params() -> dict[str, Any]:
    """params.yaml, its `experiments` section checked (`pipeline.experiments`); `train` is
    checked where each run's config is built from it."""
    from pipeline import experiments  # it imports nothing of the stages

    p = abconfig.read_yaml(PARAMS)
    experiments.check(p, str(PARAMS))
    return p


def move_aside(out: Path) -> Path:
    """Rename `out` to a timestamped sibling, which nothing here ever deletes."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    backup = out.with_name(f"{out.name}.moved-{stamp}")
    n = 1
    while backup.exists():
        n += 1
        backup = out.with_name(f"{out.name}.moved-{stamp}-{n}")
    os.rename(out, backup)
    return backup


# keys of `train` that change no number a run computes: no stage need track them
def covered(key: str, prefixes: Iterable[str]) -> bool:
    """`key` is one of `prefixes` or lies under one (train.optim covers train.optim.lr)."""
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def leaves(node: Any, prefix: str = "") -> list[str]:
    """The dotted keys of a nested section's values (an empty section counts as one)."""
    if isinstance(node, dict) and node:
        return [leaf for k, v in node.items() for leaf in leaves(v, f"{prefix}{k}.")]
    return [prefix.rstrip(".")]


def parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """A stage's or study's command line: `--help` prints its docstring's first paragraph
    (every `python -m` entry point answers it, and never runs on it)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)  # (pipeline/__init__.py)
    first = (doc or "").strip().split("\n\n")[0]
    return argparse.ArgumentParser(prog=f"python -m {prog}", description=first)


STAGE_STOPPED = "nothing of this stage was recorded"
STUDY_STOPPED = "what finished is kept, and the same command goes on from there"


def stage(
    main: Callable[..., int], *args: str, who: str = "pipeline", stopped: str = STAGE_STOPPED
) -> int:
    """A stage's (or a study's) entry point: a config error or a damaged record ends it in
    one line naming the key or file, exit code 2, as `abtrain train`'s do (DVC prints the
    line, then that the stage failed).

    Under DVC (which sets DVC_STAGE) the stage ends with DVC: a `dvc` killed by any signal
    takes the stage down by SIGTERM (past the shell DVC runs it in), which stops what the
    stage started in turn, instead of leaving it to train on and write the stage's outputs
    with no DVC to record them. Ctrl-C ends it in one line: `stopped` says what is left
    (a study that resumes keeps what finished, STUDY_STOPPED)."""
    if os.environ.get("DVC_STAGE"):
        die_with_runner(signal.SIGTERM)
    try:
        return main(*args)
    except KeyboardInterrupt:
        print(f"[{who}] stopped (Ctrl-C); {stopped}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # its reader stopped reading (`| head`): end quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except (abconfig.ConfigError, space.SpaceError, RecordError) as err:
        print(f"[{who}] error: {one_line(err)}", file=sys.stderr, flush=True)
        if note := params_left(str(err)):
            print(f"[{who}] {note}", file=sys.stderr, flush=True)
        return 2


def params_left(error: str) -> str | None:
    """Where `error` names a key that params.yaml holds otherwise than its last commit: which
    ones, and how to undo them (else None). `dvc exp run -S KEY=VALUE` writes the value into
    params.yaml and leaves it there when a stage refuses it, so the next `dvc repro` would
    meet it again."""
    import subprocess

    import yaml

    try:
        committed = subprocess.run(
            ["git", "show", f"HEAD:{PARAMS}"], capture_output=True, text=True, timeout=30
        )
        if committed.returncode:
            return None
        keys = abconfig.diff_keys(yaml.safe_load(committed.stdout), abconfig.read_yaml(PARAMS))
    except (OSError, subprocess.TimeoutExpired, yaml.YAMLError, abconfig.ConfigError):
        return None
    # a key of `train` is named without its section (optim.lr)
    named = [k for k in keys if k in error or k.removeprefix("train.") in error]
    if not named:
        return None
    return (
        f"{PARAMS} differs from its last commit in {', '.join(named)} (`dvc exp run -S` "
        f"leaves its values there): `git diff {PARAMS}` shows them, `git checkout {PARAMS}` "
        "undoes them"
    )
