"""Start a run on this machine: one torchrun per "node", as a cluster would.

`python -m abtrain.launch --nnodes 2 --nproc-per-node 2 train --config params.yaml --out DIR`
starts two torchrun processes with a static rendezvous on 127.0.0.1; each acts as one node
(torchrun's node rank becomes the node id in the traffic ledger).

Each torchrun runs in a session of its own (and starts each rank in a session of its
own), so signals are passed on by hand: a SIGTERM, SIGHUP or SIGINT to the launcher (a CI
timeout, `scancel`, a closed terminal) is passed on to every node, and the launcher returns
128 + the signal's number once they have stopped. Nothing outlives what started it, even
when that is killed outright (SIGKILL, the OOM killer): each torchrun gets SIGTERM when the
launcher dies, and each rank SIGKILL when its torchrun dies (`die_with_parent`); a node
whose torchrun was killed stops the run at once, and the launcher returns 128 + that
signal. What the last checkpoint saved is kept; the run resumes from it.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import typing
from collections.abc import Sequence
from pathlib import Path


def die_with_parent(sig: int) -> None:
    """Linux: deliver `sig` to this process when the process that started it dies (prctl's
    PR_SET_PDEATHSIG); elsewhere nothing. If that parent is already gone, exit now."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, int(sig), 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died before the request took
        os._exit(128 + int(sig))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_commands(
    nnodes: int, nproc_per_node: int, args: Sequence[str], port: int, max_restarts: int = 0
) -> list[list[str]]:
    """One torchrun command per node.

    Restarts across several nodes need the c10d rendezvous: under the static one each node's
    torchrun restarts its ranks on its own, at its own time, and the new ranks meet the old
    ones' addresses in the store (gloo: "Connection refused"). With c10d a node that restarts
    opens a new round, and the others' torchruns see it and restart theirs to join it; the
    node ranks are then handed out in order of arrival, which on one machine changes nothing.
    """
    if max_restarts and nnodes > 1:
        meet = ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}"]
        meet.append(f"--rdzv-id=abtrain-{port}")
        per_node: list[list[str]] = [meet] * nnodes
    else:
        static = ["--master-addr=127.0.0.1", f"--master-port={port}"]
        per_node = [[f"--node-rank={node}", *static] for node in range(nnodes)]
    return [
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nnodes={nnodes}",
            f"--nproc-per-node={nproc_per_node}",
            *rendezvous,
            f"--max-restarts={int(max_restarts)}",
            "-m",
            "abtrain",
            *args,
        ]
        for rendezvous in per_node
    ]


def run_local(
    nnodes: int,
    nproc_per_node: int,
    args: Sequence[str],
    env: dict[str, str] | None = None,
    grace: float = 60.0,
    max_restarts: int = 0,
) -> int:
    """Run `python -m abtrain ARGS` on nnodes × nproc_per_node ranks; returns the exit code.

    When one node fails, the others get `grace` seconds to notice and stop by themselves
    (each rank then reports what it saw), and are stopped after that. A `train` that would
    be refused (`refusal`) starts nothing: its one line, and 2.
    """
    why = refusal(args)
    if why is not None:
        print(f"error: {why}", file=sys.stderr, flush=True)
        return 2
    env = {**os.environ, **(env or {})}
    if max_restarts and nnodes > 1:
        # c10d's rendezvous otherwise hands the ranks one store for every round, and the
        # restarted ranks would read the dead ones' addresses from it
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    # torchrun sets OMP_NUM_THREADS=1 only for several ranks per node; one rank per "node"
    # would take every core, and ranks sharing this machine would fight over them.
    env.setdefault(
        "OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // (nnodes * nproc_per_node)))
    )
    procs: list[subprocess.Popen] = []
    relays: list[threading.Thread] = []
    stopping = threading.Event()
    previous = {sig: signal.signal(sig, _raise_stopped) for sig in STOP_SIGNALS}
    code, deadline = 0, None
    try:
        port = free_port()
        for cmd in torchrun_commands(nnodes, nproc_per_node, args, port, max_restarts):
            procs.append(
                subprocess.Popen(
                    cmd,
                    env=env,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                    preexec_fn=lambda: die_with_parent(signal.SIGTERM),
                )
            )
            relays.append(threading.Thread(target=_relay, args=(procs[-1], stopping)))
            relays[-1].start()
        while any(p.poll() is None for p in procs):
            if deadline is not None and time.monotonic() > deadline:
                break
            for node, p in enumerate(procs):
                if p.poll() and not code:
                    code, deadline = p.returncode, time.monotonic() + grace
                    if code < 0:  # torchrun itself killed: no rank is left to report
                        name = signal.Signals(-code).name
                        code, deadline = 128 - code, time.monotonic()
                        why = f"node {node}'s torchrun was killed by {name}"
                    else:
                        why = (
                            f"node {node} failed with exit code {code}; its torchrun "
                            "report names the rank"
                        )
                    print(f"[abtrain.launch] {why}", file=sys.stderr, flush=True)
            time.sleep(0.2)
        code = code or next((p.returncode for p in procs if p.returncode), 0)
    except Stopped as stop:
        stopping.set()
        print(f"[abtrain.launch] {stop}: stopping every node", file=sys.stderr, flush=True)
        code = 128 + stop.signum
    finally:
        for sig in STOP_SIGNALS:  # a second signal must not cut the stopping short
            signal.signal(sig, signal.SIG_IGN)
        _stop(procs)
        for relay in relays:
            relay.join(timeout=10)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if stopping.is_set():
        print(f"[abtrain.launch] every node stopped; {_last_checkpoint(args)}", file=sys.stderr)
    return code


def refusal(args: Sequence[str]) -> str | None:
    """Why `python -m abtrain ARGS` would be refused before training, said once here in one
    line rather than by every rank after torchrun started them all: arguments the command
    doesn't take, a `train` whose config can't be read or is invalid, or whose model leaves
    its AB method no layer to factorise. None when it may start, or when it can't be told
    here (a model that doesn't build in this process: the ranks report that themselves)."""
    # imported here: the launcher needs torch only to build the model it checks
    from abtrain.__main__ import build_parser
    from abtrain.check import refuse_unfactorisable
    from abtrain.config import ConfigError, load, one_line

    class Refusing(argparse.ArgumentParser):  # argparse's error as a value, not an exit
        def error(self, message: str) -> typing.NoReturn:
            raise ConfigError(f"python -m abtrain: {message}")

    try:
        ns = build_parser(Refusing).parse_args(list(args))
        if ns.command == "train":
            refuse_unfactorisable(load(ns.config, ns.overrides))
    except ConfigError as err:
        return one_line(err)
    return None


def _relay(proc: subprocess.Popen, stopping: threading.Event) -> None:
    """Pass a node's stderr (its torchrun's and its ranks') on to ours. Once the launcher
    is stopping the run, only abtrain's own lines: torchrun answers the signal with a
    SignalException traceback per node, which would bury the line that says what stopped."""
    for line in iter(proc.stderr.readline, b""):
        if not stopping.is_set() or line.startswith(b"[abtrain"):
            sys.stderr.buffer.write(line)
            sys.stderr.flush()
    proc.stderr.close()


def _last_checkpoint(args: Sequence[str]) -> str:
    """Where a stopped run resumes from, read from its run folder (`--out`)."""
    out = next((a.split("=", 1)[1] for a in args if a.startswith("--out=")), None)
    if "--out" in args and args.index("--out") + 1 < len(args):
        out = args[args.index("--out") + 1]
    if out is None:
        return "the run folder holds its last checkpoint"
    latest = Path(out) / "checkpoints" / "LATEST"
    step = latest.read_text().strip() if latest.exists() else ""
    if not step.isdigit():
        return f"no checkpoint in {latest.parent} yet: started again, the run starts over"
    return f"the run resumes from its checkpoint of step {step} in {latest.parent}"


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


class Stopped(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(f"got {signal.Signals(signum).name}")
        self.signum = signum


def _raise_stopped(signum: int, _frame: object) -> None:
    raise Stopped(signum)


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m abtrain.launch")
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--nproc-per-node", type=int, default=1)
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        help="torchrun restarts every rank this many times after a failure; each restart "
        "resumes from the last checkpoint",
    )
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments of python -m abtrain")
    ns = parser.parse_args(argv)
    return run_local(ns.nnodes, ns.nproc_per_node, ns.args, max_restarts=ns.max_restarts)


if __name__ == "__main__":
    sys.exit(main())
