"""Where a command's CPU goes, process by process (docs/testing.md's map of the test suite).

    python -m tools.cpu_map install .venv LOG   # each Python process of .venv, at its exit,
                                                # appends a line to LOG
    bash scripts/test.sh                        # or any command on that .venv
    python -m tools.cpu_map report LOG          # by kind of process, by test file, by test
    python -m tools.cpu_map uninstall .venv

A line: the process's own CPU time (user + system), whether it imported torch, the test that
started it (`PYTEST_CURRENT_TEST`, which children inherit) and its command line. A process
that ends by SIGKILL or `os._exit` (a DataLoader's workers, a killed run, the torchruns the
launcher forks) writes none, and programs that are not Python (mpirun, slurmd, Chromium) are
not counted.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

HOOK = """# written by `python -m tools.cpu_map install`; removed by `... uninstall`
import atexit as _atexit


def _cpu_map_line():
    import os, resource, sys

    ru = resource.getrusage(resource.RUSAGE_SELF)
    fields = [
        f"{{ru.ru_utime + ru.ru_stime:.3f}}",
        str("torch" in sys.modules),
        os.environ.get("PYTEST_CURRENT_TEST", "-"),
        " ".join(sys.argv)[:300],
    ]
    line = "\\t".join(f.replace("\\t", " ").replace("\\n", " ") for f in fields) + "\\n"
    try:
        with open({log!r}, "a") as f:  # one short append: whole lines from many processes
            f.write(line)
    except OSError:
        pass


_atexit.register(_cpu_map_line)
"""


def site_packages(venv: Path) -> Path:
    """The site-packages folder of the virtual environment `venv`."""
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if not found:
        raise SystemExit(f"error: {venv} holds no lib/python3*/site-packages")
    return found[0]


def install(venv: Path, log: Path) -> Path:
    target = site_packages(venv) / "sitecustomize.py"
    if target.exists() and "tools.cpu_map" not in target.read_text():
        raise SystemExit(f"error: {target} exists and is not this tool's: left as it is")
    target.write_text(HOOK.format(log=str(log.resolve())))
    return target


def uninstall(venv: Path) -> None:
    target = site_packages(venv) / "sitecustomize.py"
    if target.exists() and "tools.cpu_map" in target.read_text():
        target.unlink()


def kind(argv: str) -> str:
    """What a command line runs, in a few words."""
    rules = (
        (r"abtrain/launch\.py|-m abtrain\.launch", "launcher"),
        (r"torch/distributed/run\.py", "torchrun agent"),
        (r"abtrain/__main__\.py train", "rank (abtrain train)"),
        (r"mpi4py.* search|search/__main__\.py|^search ", "search rank"),
        (r"/dvc\b", "dvc"),
        (r"pipeline/report", "report stage"),
        (r"pipeline/", "other pipeline stage"),
        (r"abtrain/__main__\.py", "abtrain command"),
        (r"bench/", "bench module"),
        (r"pytest|^-c$", "pytest"),
    )
    for pattern, name in rules:
        if re.search(pattern, argv):
            return name
    return "other"


def report(log: Path, top: int = 30) -> str:
    rows = []
    for line in log.read_text().splitlines():
        parts = line.split("\t")
        if len(parts) == 4:
            cpu, torch, test, argv = parts
            test = re.sub(r" \((setup|call|teardown)\)$", "", test)
            rows.append((float(cpu), torch == "True", test, argv))
    total = sum(r[0] for r in rows)
    with_torch = [r for r in rows if r[1]]
    out = [
        f"{len(rows)} processes, {total:.0f} core-seconds; {len(with_torch)} imported torch "
        f"and spent {sum(r[0] for r in with_torch):.0f} of them",
        "",
        "by kind: processes, core-seconds",
    ]
    count, cpu = Counter(), Counter()
    for c, _, _, argv in rows:
        count[kind(argv)] += 1
        cpu[kind(argv)] += c
    out += [f"  {k:24} {count[k]:5} {v:8.0f}" for k, v in cpu.most_common()]
    for title, key in (("test file", lambda t: t.split("::")[0]), ("test", lambda t: t)):
        by = Counter()
        for c, _, test, _ in rows:
            by[key(test)] += c
        out += ["", f"by {title}: core-seconds (- : started outside a test)"]
        out += [f"  {v:7.0f}  {k}" for k, v in by.most_common(top)]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.cpu_map", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    i = sub.add_parser("install", help="log each Python process of VENV to LOG")
    i.add_argument("venv", type=Path)
    i.add_argument("log", type=Path)
    u = sub.add_parser("uninstall", help="remove the hook from VENV")
    u.add_argument("venv", type=Path)
    r = sub.add_parser("report", help="sum LOG up")
    r.add_argument("log", type=Path)
    r.add_argument("--top", type=int, default=30, help="rows of each table by test")
    a = ap.parse_args(argv)
    if a.command == "install":
        print(f"{install(a.venv, a.log)}: each process appends to {a.log}")
    elif a.command == "uninstall":
        uninstall(a.venv)
    else:
        print(report(a.log, a.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
