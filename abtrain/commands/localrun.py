"""One torchrun per "node" on this machine, as a cluster would run them: started, their
logs relayed, stopped together, a failure ended in one line. (`python -m abtrain.launch`
is its command:
`python -m abtrain.launch --nnodes 2 --nproc-per-node 2 train --config params.yaml --out DIR`
which starts two torchrun processes with a static rendezvous on 127.0.0.1; each acts as one node
(torchrun's node rank becomes the node id in the traffic ledger).

Each node's torchrun is this process forked (it has the torch the launcher's check already
imported, a second and a half a node saved) and runs in a session of its own, as does each
of its ranks. Where each rank gets one thread and there is no GPU (this 2-core machine's
case, and CI's) the ranks are that torchrun forked in turn, with what a rank imports
imported once here (`forks_ranks`: some three CPU-seconds a rank saved, the same numbers);
elsewhere, and on a cluster, torchrun starts each afresh (`python -u -m abtrain ...`). So
signals are passed on by hand: a SIGTERM, SIGHUP or SIGINT to the launcher (a CI timeout,
`scancel`, a closed terminal) is passed on to every node, and the launcher returns 128 + the
signal's number once they have stopped. Nothing outlives what started it, even when that is
killed outright (SIGKILL, the OOM killer): each torchrun gets SIGTERM when the launcher
dies, and each rank SIGKILL when its torchrun dies (`die_with_parent`); a node whose
torchrun was killed stops the run at once, and the launcher returns 128 + that signal. What
the last checkpoint saved is kept; the run resumes from it.
"""

from __future__ import annotations

import logging
import os
import re
import runpy
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import typing
from collections.abc import Sequence
from pathlib import Path

from abtrain.commands.preflight import refusal
from abtrain.lifetime import die_with_parent


def cores_each(processes: int) -> int:
    """This machine's cores shared out over `processes` that run at once (at least one
    each): more threads than cores leave OpenMP's threads spinning for a core another
    process holds."""
    return max(1, (os.cpu_count() or 1) // processes)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_commands(
    nnodes: int,
    nproc_per_node: int,
    args: Sequence[str],
    port: int,
    scratch: Path,
    max_restarts: int = 0,
) -> list[list[str]]:
    """One torchrun command line per node (its arguments, after `torchrun`). `scratch`:
    where node N's torchrun keeps its folders (`--log-dir scratch/node-N`), which it would
    otherwise make in $TMPDIR (`torchelastic_*`), one a launch, and never remove.

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
            f"--nnodes={nnodes}",
            f"--nproc-per-node={nproc_per_node}",
            *rendezvous,
            f"--max-restarts={int(max_restarts)}",
            f"--log-dir={scratch / f'node-{node}'}",
            "-m",
            "abtrain",
            *args,
        ]
        for node, rendezvous in enumerate(per_node)
    ]


def run_local(
    nnodes: int,
    nproc_per_node: int,
    args: Sequence[str],
    env: dict[str, str] | None = None,
    grace: float = 5.0,
    max_restarts: int = 0,
) -> int:
    """Run `python -m abtrain ARGS` on nnodes × nproc_per_node ranks; returns the exit code.

    A `train` that would be refused (`refusal`) starts nothing: its one line, and 2. Each
    node's stderr (torchrun's report, the ranks' tracebacks and warnings) goes to a log,
    OUT/logs/node-N.log for a `train` (else a temporary folder), and only abtrain's own
    lines to the screen. When one node fails, the others get `grace` seconds to stop by
    themselves; one still running then did not answer (hung, or stopped) and is killed. A
    failed run ends with one line: the cause its first failing rank gave, the node that
    did not answer, and where the logs are; its exit code is that rank's (3: the tracking
    store was lost), not torchrun's 1.
    """
    why = refusal(args, nnodes * nproc_per_node, nproc_per_node)
    if why is not None:
        print(f"error: {why}", file=sys.stderr, flush=True)
        return 2
    env = _node_env(nnodes, nproc_per_node, env, max_restarts)
    logs = _log_folder(args)
    procs: list[Node] = []
    relays: list[threading.Thread] = []
    said: list[tuple[int, str]] = []  # (node, abtrain's error line), in the order printed
    unlogged: dict[int, str] = {}  # node: why its log could not be written
    stopping = threading.Event()
    previous = {sig: signal.signal(sig, _raise_stopped) for sig in STOP_SIGNALS}
    code, failed, hung = 0, None, []
    scratch = Path(tempfile.mkdtemp(prefix="abtrain-torchrun-"))
    try:
        cmds = torchrun_commands(nnodes, nproc_per_node, args, free_port(), scratch, max_restarts)
        fork = forks_ranks(env)
        if fork:
            _import_what_a_rank_imports()
        for cmd in cmds:  # every node forked before any thread starts here
            procs.append(_start_node(cmd, env, fork))
        for node, proc in enumerate(procs):
            relay = threading.Thread(
                target=_relay,
                args=(proc, stopping, logs / f"node-{node}.log", said, node, unlogged),
            )
            relays.append(relay)
            relay.start()
        code, failed, hung = _watch(procs, grace, said)
    except Stopped as stop:
        stopping.set()
        print(f"[abtrain.launch] {stop}: stopping every node", file=sys.stderr, flush=True)
        code = 128 + stop.signum
    finally:
        for sig in STOP_SIGNALS:  # a second signal must not cut the stopping short
            signal.signal(sig, signal.SIG_IGN)
        _stop(procs, hung)
        for relay in relays:
            relay.join(timeout=10)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        shutil.rmtree(scratch, ignore_errors=True)
    if stopping.is_set():
        print(f"[abtrain.launch] every node stopped; {_last_checkpoint(args)}", file=sys.stderr)
    elif not code and logs.name.startswith("abtrain-launch-"):  # a temporary one, not needed
        shutil.rmtree(logs, ignore_errors=True)
    elif code:
        if code == 1 and failed is not None:  # torchrun's own: the rank's code is in its report
            code = _rank_exit_code(logs / f"node-{failed}.log") or code
        print(
            f"[abtrain.launch] error: {_failure_line(said, failed, code, hung, grace, logs, unlogged)}",
            file=sys.stderr,
            flush=True,
        )
    return code


def _node_env(
    nnodes: int, nproc_per_node: int, env: dict[str, str] | None, max_restarts: int
) -> dict[str, str]:
    """The environment every node's torchrun starts with."""
    env = {**os.environ, **(env or {})}
    if max_restarts and nnodes > 1:
        # c10d's rendezvous otherwise hands the ranks one store for every round, and the
        # restarted ranks would read the dead ones' addresses from it
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    # torchrun sets OMP_NUM_THREADS=1 only for several ranks per node; one rank per "node"
    # would take every core, and ranks sharing this machine would fight over them.
    env.setdefault("OMP_NUM_THREADS", str(cores_each(nnodes * nproc_per_node)))
    return env


def forks_ranks(env: dict[str, str]) -> bool:
    """Whether each node's torchrun forks its ranks from itself (they then start with torch
    and abtrain imported, some three CPU-seconds a rank saved) rather than start them
    afresh: where each rank gets one thread and the machine has no GPU. GNU OpenMP's
    threads do not survive a fork (a forked process that asks for more than one, after its
    parent had some, waits for them for ever), and CUDA, once looked for, not always: a
    GPU's ranks start afresh, as a cluster's do."""
    import torch

    return env.get("OMP_NUM_THREADS") == "1" and not torch.cuda.is_available()


FORKED = "this node's ranks are its torchrun forked (one thread each: abtrain.commands.localrun)"


def _import_what_a_rank_imports() -> None:
    """What a rank imports before it trains, imported once here for every forked rank;
    torch._dynamo too, which the optimizer's first call would import in each rank."""
    import torch._dynamo  # noqa: F401

    import abtrain.run.trainer  # noqa: F401


def _start_node(argv: list[str], env: dict[str, str], fork_ranks: bool = False) -> Node:
    """One node's torchrun (`argv`: its arguments), in a session of its own, ended with this
    process: this process forked, which has torch imported already (the launcher's check
    built the model), where `python -m torch.distributed.run` would import it again. Call it
    before this process starts threads that take locks (the relays write to stderr): a lock
    another thread held at the fork stays held in the child. (A pipeline stage's watch on its
    runner, `die_with_runner`, only waits in `select`.)"""
    read, write = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the node: it never returns to the launcher's code
        code = 1
        try:
            os.close(read)
            os.dup2(write, 2)
            os.close(write)
            os.setsid()
            for sig in STOP_SIGNALS:  # a fresh Python's handlers, not the launcher's
                signal.signal(sig, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            die_with_parent(signal.SIGTERM)
            os.environ.clear()
            os.environ.update(env)
            # the streams and log handlers of a fresh process on fds 1 and 2: the caller's
            # (a test's capture, say) would keep torchrun's report from the node's log
            sys.stdout = open(1, "w", buffering=1, closefd=False)
            sys.stderr = open(2, "w", buffering=1, errors="backslashreplace", closefd=False)
            logging.root.handlers.clear()
            code = _torchrun(argv, fork_ranks)
        except BaseException:  # before torchrun began: said in the node's log all the same
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(write)
    return Node(pid, os.fdopen(read, "rb"))


def _torchrun(argv: list[str], fork_ranks: bool) -> int:
    """torchrun's own entry point, run in this process; its exit code as `python -m
    torch.distributed.run` would give it (1 and the traceback, which holds torchrun's
    report of the failed ranks, for what it raises). With `fork_ranks` its ranks are this
    process forked, running `_forked_rank` (torchrun's own `--start-method=fork`, which it
    offers for a function), else `python -u -m abtrain ...` afresh."""
    try:
        import torch
        from torch.distributed import run
        from torch.distributed.launcher.api import elastic_launch

        if not fork_ranks:
            run.main(argv)
            return 0
        # run.main, but for the entry point: ours name their rendezvous (static with a
        # port, c10d with an endpoint), so none of its defaults for a missing one applies
        args = run.parse_args(argv)
        torch.multiprocessing._set_thread_name("pt_elastic")
        print(FORKED, file=sys.stderr, flush=True)  # the node's log says how its ranks began
        config, _, _ = run.config_from_args(args)
        config.start_method = "fork"
        elastic_launch(config, _forked_rank)(*args.training_script_args)
        return 0
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()


def _forked_rank(*args: str) -> None:
    """`python -m abtrain ARGS` (runpy's, as `-m` runs it) in a rank forked from its node's
    torchrun, started as torchrun starts one afresh: in a session of its own, with a fresh
    Python's signal handlers (not torchrun's, which raise), one thread, the same `sys.argv`,
    and its traceback and exit code for a failure."""
    os.setsid()
    try:  # what `ps` and `top` show for it: its torchrun named itself pt_elastic
        Path("/proc/self/comm").write_text(f"abtrain rank {os.environ.get('RANK', '')}"[:15])
    except OSError:
        pass
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import torch

    torch.set_num_threads(1)
    sys.argv = ["-m", *args]  # runpy puts the module's path first, as `python -m` does
    try:
        runpy.run_module("abtrain", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as stop:
        code = stop.code
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    if code:
        # torchrun reports one failure of forked ranks, the first it finds ended (a fresh
        # rank's report names the earliest): a rank failing on a peer that died without a
        # word waits, so that its torchrun finds the peer's own end first and names it
        time.sleep(FAILED_RANK_WAIT_S)
        sys.exit(code)


FAILED_RANK_WAIT_S = 1.0  # ten of torchrun's looks at its ranks (--monitor-interval 0.1)


class Node:
    """A node's torchrun as the launcher watches it: its pid, its stderr, and its exit code
    once it ended (negative: the signal that killed it), as `subprocess.Popen` gives them."""

    def __init__(self, pid: int, stderr: typing.IO[bytes]) -> None:
        self.pid, self.stderr = pid, stderr
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"node {self.pid}", timeout)
            time.sleep(0.05)
        return self.returncode


def _watch(
    procs: list[Node], grace: float, said: list[tuple[int, str]]
) -> tuple[int, int | None, list[int]]:
    """Wait for every node; after the first failure the others get `grace` seconds, and
    after a torchrun killed none. Returns (exit code, the node that failed first, or whose
    torchrun was killed: that explains the others' failures, seen before it or not; the
    nodes that did not answer)."""
    code, deadline, failed, killed = 0, None, None, False
    while True:
        running = [node for node, p in enumerate(procs) if p.poll() is None]
        for node, p in enumerate(procs):
            if killed or not p.returncode:
                continue
            if p.returncode < 0:  # torchrun itself killed: no rank is left to report
                how = signal.Signals(-p.returncode).name
                said.insert(0, (node, f"node {node}'s torchrun was killed by {how}"))
                code, deadline, failed, killed = 128 - p.returncode, time.monotonic(), node, True
            elif not code:
                code, deadline, failed = p.returncode, time.monotonic() + grace, node
        if not running:
            return code, failed, []
        if deadline is not None and time.monotonic() > deadline:
            return code, failed, running
        time.sleep(0.2)


def _log_folder(args: Sequence[str]) -> Path:
    """Where the nodes' logs go: the run folder's logs/ for a `train`, else a new temporary
    folder."""
    out = _run_folder(args)
    if out is None or not args or args[0] != "train":
        return Path(tempfile.mkdtemp(prefix="abtrain-launch-"))
    (Path(out) / "logs").mkdir(parents=True, exist_ok=True)
    return Path(out) / "logs"


def _failure_line(
    said: list[tuple[int, str]],
    failed: int | None,
    code: int,
    hung: list[int],
    grace: float,
    logs: Path,
    unlogged: dict[int, str] | None = None,
) -> str:
    """The run's failure in one line: the cause, which nodes did not answer, and the logs
    holding torchrun's reports. The cause: the rendezvous port taken by another process
    (a node's torchrun could not listen on it); else a rank that died without a word
    (killed, or an exit of its own: a torchrun report names it, and it printed no failure
    line), for the others' failures then only answer its going; else the first failure a
    rank printed; else the first failed node's exit code. A silent rank that left with the
    exit code of a rank that spoke (3: every rank stops when the tracking store is lost,
    rank 0 says why) followed that rank, and is no cause."""
    nodes = sorted(range(len(list(logs.glob("node-*.log")))), key=lambda n: n != failed)
    port = next((p for n in nodes if (p := _port_in_use(logs / f"node-{n}.log"))), None)
    roots = {n: root for n in nodes if (root := _root_cause(logs / f"node-{n}.log"))}
    spoke = {int(m.group(1)) for _, text in said if (m := re.match(r"rank (\d+) ", text))}
    spoken = {code for rank, code in roots.values() if rank in spoke}
    if said and not spoke:  # a cause printed by rank 0 for every rank (`[abtrain] error:`)
        spoken.add(code)
    silent = []
    for node, (rank, exit_code) in roots.items():
        if rank in spoke or exit_code in spoken:
            continue
        how = (
            f"was killed by {signal.Signals(-exit_code).name}"
            if exit_code < 0
            else f"exited with code {exit_code}"
        )
        silent.append(f"rank {rank} (node {node}) {how} without a word")
    if port is not None:
        cause = (
            f"the rendezvous port 127.0.0.1:{port} is in use by another process, so the "
            "nodes could not meet; run again (the launcher picks a free port each time)"
        )
        hung = []  # the other nodes were waiting to meet: they are not at fault
    elif said and said[0][1].startswith("node "):  # a torchrun killed: the launcher's own
        cause = said[0][1]
    elif silent:
        cause = silent[0]
    elif said:
        cause = said[0][1]
    else:
        cause = f"node {failed} failed with exit code {code}"
    parts = [cause]
    if hung:
        nodes = ", ".join(str(n) for n in hung)
        parts.append(
            f"node{'s' * (len(hung) > 1)} {nodes} did not answer within {grace:g} s of it and "
            f"{'were' if len(hung) > 1 else 'was'} killed"
        )
    if unlogged:
        nodes = ", ".join(f"node {n}: {why}" for n, why in sorted(unlogged.items()))
        parts.append(f"the logs in {logs} could not be written ({nodes})")
    else:
        parts.append(f"torchrun's report and the tracebacks: {logs}/node-*.log")
    return "; ".join(parts)


def _root_cause(log: Path) -> tuple[int, int] | None:
    """(rank, exit code) of the first failure in a node's torchrun report (its log: "Root
    Cause ... rank : 3 (local_rank: 1) ... exitcode : 13"), or None."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    text = text[text.find("Root Cause") :] if "Root Cause" in text else text
    rank = re.search(r"rank\s*:\s*(\d+)", text)
    code = re.search(r"exitcode\s*:\s*(-?\d+)", text)
    return (int(rank.group(1)), int(code.group(1))) if rank and code else None


def _port_in_use(log: Path) -> int | None:
    """The port a node's torchrun could not listen on (its log: "...failed to listen on
    any local network address. port: 42973, ... name: EADDRINUSE"), or None."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    found = re.search(r"port: (\d+),[^\n]*EADDRINUSE", text)
    return int(found.group(1)) if found else None


def _rank_exit_code(log: Path) -> int | None:
    """The exit code of the first failed rank in a node's torchrun report (its log)."""
    root = _root_cause(log)
    return root[1] if root and root[1] > 0 else None


def _cause(line: str) -> str | None:
    """A rank's own account of its failure (abtrain/__main__.py prints it before it raises,
    or its one-line error), or None for any other line."""
    for prefix in ("[abtrain] error: ", "error: "):
        if line.startswith(prefix):
            return line[len(prefix) :]
    if re.match(r"\[abtrain\] rank \d+ \(node \d+\) failed: ", line):
        return line[len("[abtrain] ") :]
    return None


def _relay(
    proc: Node,
    stopping: threading.Event,
    log: Path,
    said: list[tuple[int, str]],
    node: int,
    unlogged: dict[int, str],
) -> None:
    """A node's stderr (its torchrun's and its ranks') into its log; abtrain's own lines on
    to ours as well (unless the launcher is stopping the run: then torchrun answers the
    signal with a traceback per node, and abtrain's lines would repeat it). The ranks' error
    lines are kept in `said`, with the node, for the cause the last line names. A log that
    can't be written (a full disk: often the very failure) is given up, its reason kept in
    `unlogged`, and the relaying goes on: the screen's lines matter more than the log."""
    f = None
    try:
        f = open(log, "ab")
    except OSError as err:
        unlogged[node] = err.strerror or str(err)
    for line in iter(proc.stderr.readline, b""):
        if f is not None:
            try:
                f.write(line)
                f.flush()
            except OSError as err:
                unlogged[node] = err.strerror or str(err)
                f = _closed(f)
        text = line.decode(errors="replace").rstrip()
        ours = text.startswith(("[abtrain", "error: "))
        if ours and not stopping.is_set():
            sys.stderr.write(text + "\n")
            sys.stderr.flush()
        if (cause := _cause(text)) is not None:
            said.append((node, cause))
    if f is not None:
        _closed(f)
    proc.stderr.close()


def _closed(f: typing.IO[bytes]) -> None:
    """Close a log whose buffer may not fit on the disk any more."""
    try:
        f.close()
    except OSError:
        pass


def _run_folder(args: Sequence[str]) -> str | None:
    """The run folder an `abtrain` command line names (`--out DIR` or `--out=DIR`)."""
    out = next((a.split("=", 1)[1] for a in args if a.startswith("--out=")), None)
    if "--out" in args and args.index("--out") + 1 < len(args):
        out = args[args.index("--out") + 1]
    return out


def _last_checkpoint(args: Sequence[str]) -> str:
    """Where a stopped run resumes from, read from its run folder (`--out`)."""
    out = _run_folder(args)
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


def _stop(procs: list[Node], hung: Sequence[int] = ()) -> None:
    """Every node still running: SIGTERM (and SIGCONT, which a stopped node needs to act on
    it), then SIGKILL after 10 s; a node that did not answer (`hung`) SIGKILL at once (its
    ranks follow their torchrun: `die_with_parent`)."""
    for node, p in enumerate(procs):
        if p.poll() is None:
            for sig in (signal.SIGKILL,) if node in hung else (signal.SIGTERM, signal.SIGCONT):
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
