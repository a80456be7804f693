"""`python -m pipeline.retrain NAME`: train one run of the matrix again, from scratch, and
nothing else. Its folder (runs/train/NAME, every seed's) is moved aside to a timestamped
sibling, which nothing deletes, then DVC prepares the data if it isn't yet (`dvc repro
prepare`, as on a fresh clone) and runs that one stage (`dvc repro --single-item --force
train@NAME`): no search reruns, no other run is retrained or made stale, and the
run's results/, plots/ and metrics/ files and its lines in dvc.lock are rewritten. The
report then differs from the run's new files until `dvc repro report` (or `dvc repro`).

`dvc repro -f train@NAME` is not this: --force reruns every stage upstream of the run too
(prepare and the searches, whose new record moves every run), and with --single-item alone
the stage finds the run's folder finished and trains nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys

from pipeline.common import RUNS, move_aside, params, runs, stage


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
    if folder.exists():
        print(f"[pipeline] {folder} moved to {move_aside(folder)}; training {name} afresh")
    dvc = os.path.join(os.path.dirname(sys.executable), "dvc")
    dvc = dvc if os.path.exists(dvc) else "dvc"
    # the data the run reads (a fresh clone has none yet); a no-op once it is prepared
    if code := subprocess.run([dvc, "repro", "prepare"]).returncode:
        return code
    return subprocess.run([dvc, "repro", "--single-item", "--force", f"train@{name}"]).returncode


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m pipeline.retrain NAME (a run of experiments.runs)", file=sys.stderr)
        sys.exit(2)
    sys.exit(stage(main, sys.argv[1]))
