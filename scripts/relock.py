"""`python scripts/relock.py`: dvc.lock's hashes of the code the stages depend on (abtrain/,
search/, pipeline/, bench/) set to the checkout's, running no stage. For a change to the code
that computes nothing differently (how ranks start, a message); a change that does is rerun
instead (`dvc repro`). `--check` changes nothing and exits 1 on a stale lock (a fast test
runs it)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

from dvc.repo import Repo
from ruamel.yaml import YAML

CODE = ("abtrain", "search", "pipeline", "bench")


def code_deps(repo: Repo) -> Iterator[tuple[str, object]]:
    """(stage, dependency) for every code dependency of every stage, foreach stages expanded."""
    for stage in repo.index.stages:
        for dep in stage.deps:
            if dep.def_path.split("/")[0] in CODE:
                yield stage.addressing, dep


def is_stale(dep: object) -> bool:
    """Whether dvc.lock's hash of `dep` is not the checkout's (DVC's own hashing, as
    `dvc status` reads it)."""
    return dep.hash_info.value != dep.get_hash().value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    args = ap.parse_args(argv)
    yaml = YAML()
    lock_path = Path("dvc.lock")
    lock = yaml.load(lock_path)
    checked, stale = 0, []
    with Repo(".") as repo:
        for stage, dep in code_deps(repo):
            checked += 1
            if not is_stale(dep):
                continue
            stale.append(f"{stage}: {dep.def_path}")
            dep.save()
            now = dep.dumpd()
            for entry in lock["stages"][stage].get("deps", []):
                if entry["path"] == dep.def_path:
                    entry.update({k: now[k] for k in ("md5", "size", "nfiles") if k in now})
    print(f"{checked} code dependencies checked")
    if args.check:
        print("\n".join(f"stale: {s}" for s in stale) or "dvc.lock holds the checkout's code")
        return 1 if stale else 0
    if stale:
        with lock_path.open("w") as f:
            yaml.dump(lock, f)
    print("\n".join(stale) or "dvc.lock holds the checkout's code already")
    return 0


if __name__ == "__main__":
    sys.exit(main())
