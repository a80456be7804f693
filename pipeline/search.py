"""Stage `search@BACKEND`: the hyperparameter search under mpirun, in runs/search/BACKEND,
on this machine or as one SLURM job (experiments.launcher); then its record, best.json and
evaluations.jsonl, in results/search/BACKEND.

The record is committed with dvc.lock, so `dvc repro` on a fresh clone trains from the
committed best instead of rerunning a search whose choice moves with timing (Propulate's
results arrive asynchronously). DVC reruns the stage when its inputs change, or on
`dvc repro --force --downstream search@BACKEND` (a rerun on purpose).

An unfinished search folder with the same settings is resumed (a killed attempt, or a
larger budget). A finished one (the stage reran: its code changed, or a rerun was asked
for) or one with other settings is moved aside to a timestamped sibling and the search
starts afresh. A resume that fails fails the stage and leaves the folder as it is: no
finished evaluation is ever deleted here.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from abtrain import config as abconfig
from abtrain.config import ConfigError
from abtrain.files import atomic_write_text, read_record, read_record_rows
from pipeline.stage import RUNS, SEARCHES, covered, leaves, move_aside, params, parser, stage
from search import record
from search.launch import run_mpirun

Starter = Callable[[list[str]], int]  # launches the search with these extra arguments


def differing(args: list[str], ranks: int) -> list[str] | None:
    """The settings that keep the folder's search from resuming; None when that can't be told,
    in which case the driver's own check decides (and names the reason)."""
    from abtrain.config import ConfigError
    from search.driver import differing_settings
    from search.space import SpaceError

    try:
        return differing_settings(args, ranks)
    except (SpaceError, ConfigError, OSError, ValueError) as err:
        print(f"[pipeline] can't compare the settings ({err}): trying --resume", flush=True)
        return None


def publish(out: Path, dest: Path) -> None:
    """The search's record: its best and one row per evaluation (a row evaluated again after
    a resume once, its latest), each file written whole."""
    dest.mkdir(parents=True, exist_ok=True)
    atomic_write_text(dest / "best.json", (out / "best.json").read_text())
    rows = "".join(json.dumps(r) + "\n" for r in record.evaluations(out))
    atomic_write_text(dest / record.EVALUATIONS, rows)
    print(f"[pipeline] the search's record: {dest}", flush=True)


def stage_line(p: dict, backend: str) -> str:
    """Which of the pipeline's searches this is (dvc.yaml's list), and its budget."""
    try:
        backends = list(yaml.safe_load(Path("dvc.yaml").read_text())["stages"]["search"]["foreach"])
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        backends = []  # run outside the pipeline: no place to tell
    s = p["search"]
    place = f" {backends.index(backend) + 1} of {len(backends)}" if backend in backends else ""
    return (
        f"[pipeline] search{place}: {backend} ({s['evaluations']} evaluations on {s['ranks']} "
        f"ranks, {s['ranks_per_worker']} per worker)"
    )


# keys of `train` that change no number a search finds
def search_inputs(p: dict[str, Any]) -> set[str]:
    """The keys of `train` whose values the search's runs read: all but those search.train or
    the space set, and those that change no number."""
    given = dict(o.partition("=")[::2] for o in p["search"]["train"])
    set_by = {k.strip() for k in given} | set(p["search"]["space"])
    # the sections of local SGD and DiLoCo are read by their own method only
    method = str(given.get("method", p["train"]["method"])).strip()
    from abtrain.method.methods import unread_sections  # torch: only where it is asked

    unread = [] if "method" in p["search"]["space"] else list(unread_sections(method))
    return {
        k
        for k in leaves(p["train"])
        if not covered(k, set_by) and not covered(k, [*abconfig.NOT_TRAINING, *unread])
    }


def untracked_inputs(p: dict[str, Any], dvc_yaml: Path = Path("dvc.yaml")) -> list[str]:
    """The keys the search reads that dvc.yaml's search stage does not track (after an edit of
    search.train or the space): a change of them would not rerun the search."""
    listed = yaml.safe_load(dvc_yaml.read_text())["stages"]["search"]["do"]["params"]
    tracked = [x.removeprefix("train.") for x in listed if x.startswith("train.")]
    return sorted(k for k in search_inputs(p) if not covered(k, tracked))


def check(p: dict[str, Any], args: list[str]) -> None:
    """Everything that can be wrong with the search's settings, before mpirun starts; and, in
    the pipeline, that its stage tracks every key the search reads."""
    from search.driver import parse, validate

    validate(parse(args), int(p["search"]["ranks"]))
    if Path("dvc.yaml").exists() and (missing := untracked_inputs(p)):
        raise ConfigError(
            f"dvc.yaml: the search stage reads train.{missing[0]} (search.train and "
            f"search.space no longer set it) but does not track it"
            + (f", nor {len(missing) - 1} more" if len(missing) > 1 else "")
            + ": add them to its params"
        )


def committed_record(folder: Path) -> None:
    """The search's committed record, if there is one, is whole: a damaged one is named
    (RecordError) before anything starts, never taken for a search to run again."""
    if (folder / "best.json").exists():
        read_record(folder / "best.json", ("params", "overrides"), DELETE_TO_RERUN)
    if (folder / record.EVALUATIONS).exists():
        read_record_rows(folder / record.EVALUATIONS, ("id",), DELETE_TO_RERUN)


DELETE_TO_RERUN = "it is not in git: remove the folder to search afresh"


def main(backend: str) -> int:
    p = params()
    print(stage_line(p, backend), flush=True)
    committed_record(SEARCHES / backend)
    out = (RUNS / "search" / backend).resolve()  # messages name the folder in full
    args = ["--backend", backend, "--out", str(out)]
    check(p, args)
    if p["experiments"]["launcher"] == "slurm":
        from pipeline.slurm import run_search

        def start(extra: list[str]) -> int:
            return run_search(p, args + extra, out)
    else:

        def start(extra: list[str]) -> int:
            return run_mpirun(int(p["search"]["ranks"]), args + extra)

    code = search(out, args, int(p["search"]["ranks"]), int(p["search"]["evaluations"]), start)
    if code == 0:
        publish(out, SEARCHES / backend)
    return code


def finished(out: Path, budget: int) -> bool:
    try:
        return (out / "best.json").exists() and len(record.evaluations(out)) >= budget
    except record.SearchError:
        return False  # the resume names the damage


def search(out: Path, args: list[str], ranks: int, budget: int, start: Starter) -> int:
    """Resume, or move aside and start afresh (see the module's docstring)."""
    if (out / "search.json").exists():
        differ = differing(args, ranks)
        if differ == [] and finished(out, budget):
            backup = move_aside(out)
            print(
                f"[pipeline] {out} holds a finished search with these settings, yet the stage "
                f"reran (its code changed, or a rerun was asked for): moved it to {backup}, "
                "starting afresh",
                flush=True,
            )
            return start([])
        if not differ:
            code = start(["--resume"])
            if code != 0:
                print(
                    f"[pipeline] error: could not resume the search in {out} (exit {code}, the "
                    "reason is above); the folder is left as it is, with every finished "
                    "evaluation: fix the cause and run the stage again, or move the folder "
                    "away to start afresh",
                    file=sys.stderr,
                    flush=True,
                )
            return code
        backup = move_aside(out)
        print(
            f"[pipeline] {out} holds a search with other settings ({', '.join(differ)}): "
            f"moved it to {backup}, starting afresh",
            flush=True,
        )
    elif out.exists() and any(out.iterdir()):
        backup = move_aside(out)  # not a search the driver could resume or start over
        print(f"[pipeline] {out} holds no search.json: moved it to {backup}", flush=True)
    return start([])


if __name__ == "__main__":
    ap = parser("pipeline.search", __doc__)
    ap.add_argument("backend", choices=["propulate", "optuna"])
    sys.exit(stage(main, ap.parse_args().backend))
