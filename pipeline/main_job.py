"""The main job's `dvc repro`, and at its end where the time went: the set-up
(scripts/main.sh measures it), then each stage DVC ran, from its "Running stage" line to the
next stage's (or the end), and how many stages were up to date.

    python -m pipeline.main_job [--setup-seconds S] [-- DVC REPRO ARGUMENTS]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time

from abtrain.run.progress import duration

RUNNING = re.compile(r"Running stage '([^']+)'")
SKIPPED = re.compile(r"Stage '([^']+)' didn't change, skipping")


def timed(command: list[str]) -> tuple[int, list[tuple[str, float]], int, float]:
    """Run `command`, passing its output through; its exit code, each stage it ran with its
    seconds, the stages it found up to date, and the total seconds."""
    t0 = time.monotonic()
    stages: list[tuple[str, float]] = []
    skipped, current, since = 0, None, t0
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, bufsize=1) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            now = time.monotonic()
            if (m := RUNNING.search(line)) or SKIPPED.search(line):
                if current is not None:
                    stages.append((current, now - since))
                current, since = (m.group(1), now) if m else (None, now)
                skipped += 0 if m else 1
    end = time.monotonic()
    if current is not None:
        stages.append((current, end - since))
    return proc.returncode, stages, skipped, end - t0


def report(setup: float | None, stages: list[tuple[str, float]], skipped: int, total: float) -> str:
    rows = ([("set-up", setup)] if setup is not None else []) + stages
    width = max([len(name) for name, _ in rows] + [10])
    lines = [f"[main job] where the time went ({duration(total + (setup or 0))} in all):"]
    lines += [f"  {name:<{width}}  {duration(s):>8}" for name, s in rows]
    if skipped:
        lines.append(f"  {skipped} stage{'s' * (skipped > 1)} up to date (not run)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipeline.main_job", description=__doc__)
    p.add_argument("--setup-seconds", type=float, default=None)
    p.add_argument("--command", nargs=argparse.REMAINDER, default=None, help=argparse.SUPPRESS)
    p.add_argument("repro_args", nargs="*", help="further arguments of `dvc repro`")
    a = p.parse_args(argv)
    command = a.command or ["dvc", "repro", *a.repro_args]
    code, stages, skipped, total = timed(command)
    print(report(a.setup_seconds, stages, skipped, total), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
