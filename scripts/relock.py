"""`python scripts/relock.py`: dvc.lock's hashes of the code the stages depend on (abtrain/,
search/, pipeline/, bench/) set to the checkout's, running no stage. For a change to the code
that computes nothing differently (how ranks start, a message); a change that does is rerun
instead (`dvc repro`). `tests/pipeline/test_main_job.py` fails on a lock left stale."""

from __future__ import annotations

import sys
from pathlib import Path

from dvc.repo import Repo
from ruamel.yaml import YAML

CODE = ("abtrain", "search", "pipeline", "bench")


def main() -> int:
    yaml = YAML()
    lock_path = Path("dvc.lock")
    lock = yaml.load(lock_path)
    changed = []
    with Repo(".") as repo:
        for stage in repo.index.stages:
            for dep in stage.deps:
                if dep.def_path.split("/")[0] not in CODE:
                    continue
                dep.save()  # DVC's own hash of the path now, as `dvc status` takes it
                now = dep.dumpd()
                for entry in lock["stages"][stage.addressing].get("deps", []):
                    if entry["path"] == dep.def_path and entry.get("md5") != now["md5"]:
                        changed.append(f"{stage.addressing}: {dep.def_path}")
                        entry.update({k: now[k] for k in ("md5", "size", "nfiles") if k in now})
    with lock_path.open("w") as f:
        yaml.dump(lock, f)
    print("\n".join(changed) or "dvc.lock holds the checkout's code already")
    return 0


if __name__ == "__main__":
    sys.exit(main())
