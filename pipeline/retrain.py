"""`python -m pipeline.retrain NAME`: train one run of the matrix again, from scratch, then
the report, and nothing else.

Its folder (runs/train/NAME, every seed's) is moved aside to a timestamped sibling, which
nothing deletes; DVC prepares the data if it isn't yet (`dvc repro prepare`, as on a fresh
clone), runs that one stage (`dvc repro --single-item --force train@NAME`) and then the report
alone (`dvc repro --single-item report`), which reads every run's committed results/ file.
No search reruns, no other run is retrained or made stale; the run's results/, plots/ and
metrics/ files, the report and their lines in dvc.lock are rewritten.

Not `dvc repro -f train@NAME`: --force reruns every stage upstream of the run too (prepare and
the searches, whose new record moves every run), and with --single-item alone the stage finds
the run's folder finished and trains nothing. Not `dvc repro report` after it either: on a
fresh clone the other runs' folders are absent, so DVC would train them all again first.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys

from abtrain.config import ConfigError
from abtrain.files import held, hold
from abtrain.lifetime import die_with_parent
from pipeline.matrix import runs
from pipeline.stage import RUNS, move_aside, params, stage


def main(name: str) -> int:
    matrix = runs(params())
    if name not in matrix:
        print(
            f"[pipeline] error: experiments.runs has no run named {name!r} "
            f"(it has {', '.join(matrix)})",
            file=sys.stderr,
        )
        return 2
    folder = RUNS / "train" / name
    # refused before anything moves: another retrain of it, or a run training in its folder
    if hold(lock := RUNS / "train" / f".{name}.retrain.lock") is None:
        raise ConfigError(f"{name} is being trained again already ({lock} is held): nothing moved")
    if held(folder / ".lock"):
        raise ConfigError(f"{folder} is in use by a run training now: nothing moved")
    if folder.exists():
        print(f"[pipeline] {folder} moved to {move_aside(folder)}; training {name} afresh")
    dvc = os.path.join(os.path.dirname(sys.executable), "dvc")
    dvc = dvc if os.path.exists(dvc) else "dvc"
    steps = (
        ["prepare"],  # the data the run reads (a fresh clone has none yet); else a no-op
        ["--single-item", "--force", f"train@{name}"],
        ["--single-item", "report"],
    )
    for args in steps:  # DVC goes with this command, and its stage with DVC
        done = subprocess.run(
            [dvc, "repro", *args], preexec_fn=lambda: die_with_parent(signal.SIGTERM)
        )
        if code := done.returncode:
            return code
    print(
        f"[pipeline] {name} trained again and the report remade (reports/README.md); "
        "`python -m pipeline.report --readme` copies its headline into the README",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(
        prog="python -m pipeline.retrain", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("name", help="a run of experiments.runs in params.yaml (e.g. ab-2x2)")
    sys.exit(stage(main, ap.parse_args().name))
