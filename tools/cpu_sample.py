"""Every process's CPU, sampled once a second while a command runs (docs/testing.md).

    python -m tools.cpu_sample run OUT.json -- bash scripts/test.sh
    python -m tools.cpu_sample report OUT.json   # idle by minute, by kind, by test

`tools/cpu_map.py` counts the Python processes that end normally; this reads /proc, so it
also counts what that misses: processes killed by a signal (a killed run's ranks, a search's
mpirun), programs that are not Python (mpirun, slurmd, Chromium), the kernel's own threads,
and the machine's idle time. Each process is seen to within a second of its end: one that
lives less than a second may be missed. A process's test is its `PYTEST_CURRENT_TEST`, or
its parent's where mpirun or Slurm cleared it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from abtrain.lifetime import die_with_parent

HZ = os.sysconf("SC_CLK_TCK")


def _read(path: str, mode: str = "r") -> str | bytes | None:
    try:
        with open(path, mode) as f:
            return f.read()
    except OSError:  # the process ended between listing and reading
        return None


def _first_sight(pid: str) -> dict:
    raw = _read(f"/proc/{pid}/cmdline", "rb") or b""
    env = _read(f"/proc/{pid}/environ", "rb") or b""
    test = next((kv[20:] for kv in env.split(b"\0") if kv.startswith(b"PYTEST_CURRENT_TEST=")), b"")
    return {
        "cmd": raw.replace(b"\0", b" ").decode(errors="replace")[:300],
        "test": re.sub(r" \((setup|call|teardown)\)$", "", test.decode(errors="replace")),
    }


def scan(seen: dict[str, dict]) -> None:
    """One pass over /proc: each process's CPU so far, keyed by pid and start time."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        stat = _read(f"/proc/{pid}/stat")
        if stat is None:
            continue
        comm, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :]
        f = rest.split()
        key = f"{pid}:{f[19]}"  # a pid is reused; with its start time it is not
        if key not in seen:
            seen[key] = {"pid": int(pid), "ppid": int(f[1]), "comm": comm, **_first_sight(pid)}
        seen[key]["cpu"] = (int(f[11]) + int(f[12])) / HZ
        seen[key]["comm"] = comm  # its last: torchrun renames itself pt_elastic


def machine() -> list[int]:
    """/proc/stat's first line: user, nice, system, idle, iowait, ... in clock ticks."""
    return [int(x) for x in (_read("/proc/stat") or "").splitlines()[0].split()[1:]]


def run(out: Path, command: list[str]) -> int:
    """Run `command`, sampling every second until it ends; write OUT (atomically)."""
    seen: dict[str, dict] = {}
    ticks = []
    # killed outright, the sampler takes its command with it, as if it had been killed itself
    proc = subprocess.Popen(command, preexec_fn=lambda: die_with_parent(signal.SIGKILL))
    while True:
        ticks.append((time.time(), machine()))
        scan(seen)
        if proc.poll() is not None:
            break
        time.sleep(max(0.0, 1.0 - (time.time() - ticks[-1][0])))
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps({"processes": list(seen.values()), "machine": ticks}))
    os.replace(tmp, out)
    return proc.returncode


def kind(p: dict) -> str:
    """A process's kind: its program's name, and for Python the module it runs (mpi4py's
    and abtrain's with what they run: `python -m mpi4py -m search`, `python -m abtrain train`)."""
    if p["comm"] == "pt_elastic":  # torchrun's name for itself, started or forked
        return "torchrun (pt_elastic)"
    if p["comm"].startswith("abtrain rank"):  # a rank forked from its torchrun (localrun)
        return "python -m abtrain train"
    words = p["cmd"].split()
    if not p["comm"].startswith("python") or "-m" not in words[:-1]:
        return p["comm"] if not p["comm"].startswith("python") else "python " + " ".join(words[1:2])
    at = words.index("-m") + 1
    name = f"python -m {words[at]}"
    follows = words[at + 1 : at + 3]
    if words[at] == "mpi4py" and follows[:1] == ["-m"]:
        name += f" -m {follows[1]}" if len(follows) > 1 else ""
    elif words[at] == "abtrain" and follows and not follows[0].startswith("-"):
        name += f" {follows[0]}"
    return name


def report(path: Path) -> str:
    data = json.loads(path.read_text())
    procs = data["processes"]
    by_pid = {p["pid"]: p for p in procs}

    def test_of(p: dict, hops: int = 0) -> str:
        parent = by_pid.get(p["ppid"])
        if p["test"] or parent is None or parent is p or hops > 40:
            return p["test"]
        return test_of(parent, hops + 1)

    ticks = data["machine"]
    lines = [f"{len(procs)} processes, {sum(p['cpu'] for p in procs):.0f} CPU-seconds "
             f"in {ticks[-1][0] - ticks[0][0]:.0f} s"]  # fmt: skip
    idle = []
    for minute in range(0, len(ticks) - 1, 60):
        a, b = ticks[minute][1], ticks[min(minute + 60, len(ticks) - 1)][1]
        spent = [y - x for x, y in zip(a, b)]
        idle.append(f"{100 * (spent[3] + spent[4]) / max(1, sum(spent)):.0f}")
    lines.append("idle % by minute: " + " ".join(idle))
    for title, key in (("by kind", kind), ("by test file", lambda p: test_of(p).split("::")[0]),
                       ("by test", test_of)):  # fmt: skip
        cpu, count = Counter(), Counter()
        for p in procs:
            cpu[key(p) or "-"] += p["cpu"]
            count[key(p) or "-"] += 1
        lines.append(f"{title} (CPU-seconds, processes):")
        lines += [f"  {c:8.1f} {count[k]:5}  {k}" for k, c in cpu.most_common(25)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    r = sub.add_parser("run", help="run a command and sample every process until it ends")
    r.add_argument("out", type=Path)
    r.add_argument("command", nargs=argparse.REMAINDER)
    sub.add_parser("report", help="what a sample shows").add_argument("out", type=Path)
    args = ap.parse_args(argv)
    if args.what == "report":
        print(report(args.out))
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("run: give the command after --")
    return run(args.out, command)


if __name__ == "__main__":
    sys.exit(main())
