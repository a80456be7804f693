"""A real SLURM cluster on this machine: slurmctld and two slurmd "nodes" (n1, n2) on
127.0.0.1, no munge (auth/none), state and spool under a temporary folder. Brought up and
down by the tests; only its own daemons are killed."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path


def available() -> bool:
    return all(shutil.which(t) for t in ("slurmctld", "slurmd", "sbatch", "sinfo"))


def _ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _consecutive_ports() -> tuple[int, int]:
    """Two free consecutive ports for NodeName=n[1-2] Port=P-P+1."""
    for _ in range(50):
        (p,) = _ports(1)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", p))
                b.bind(("127.0.0.1", p + 1))
            return p, p + 1
        except OSError:
            continue
    raise RuntimeError("no two consecutive free ports")


def write_conf(d: Path) -> Path:
    """The cluster's slurm.conf. MinJobAge=0 (completed jobs never purged: a test cluster
    has a few dozen) because `sbatch --wait` polls its job after 2 s, then 8, then every
    32 while the interval is below half of MinJobAge: at the default 300 each job is seen
    done up to 32 s late, at 0 within 2 s."""
    ctl = _ports(1)[0]
    p1, p2 = _consecutive_ports()
    for sub in ("state", "spool", "log"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    conf = d / "slurm.conf"
    conf.write_text(f"""ClusterName=abtrain
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctl}
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
ReturnToService=2
EnforcePartLimits=ALL
MailProg=/bin/true
JobCompType=jobcomp/none
MpiDefault=none
SlurmdParameters=config_overrides
KillWait=5
InactiveLimit=0
MinJobAge=0
NodeName=n[1-2] NodeHostname=localhost NodeAddr=127.0.0.1 Port={p1}-{p2} CPUs=4 State=UNKNOWN
PartitionName=debug Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
""")
    return conf


# Held while a cluster is up: under pytest-xdist two test files may want one at once, and
# two slurmd pairs on one machine share more than their ports (node names, /dev/shm)
LOCK = Path(tempfile.gettempdir()) / "abtrain-slurm-cluster.lock"


@contextmanager
def local_cluster(d: Path):
    """Yields the environment (SLURM_CONF) under which sbatch & co. reach the cluster;
    one cluster at a time on this machine (LOCK)."""
    with LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        with _cluster(d) as env:
            yield env


@contextmanager
def _cluster(d: Path):
    conf = write_conf(d)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    procs = [
        subprocess.Popen(
            ["slurmctld", "-D", "-i", "-f", str(conf)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    ]
    try:
        _wait(
            lambda: (
                subprocess.run(
                    ["scontrol", "ping"], env=env, capture_output=True, text=True, timeout=10
                ).stdout.count("UP")
                > 0
            ),
            30,
            "slurmctld",
        )
        for node in ("n1", "n2"):
            procs.append(
                subprocess.Popen(
                    ["slurmd", "-D", "-N", node, "-f", str(conf)],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
        _wait(lambda: _idle(env) == 2, 60, "two idle nodes")
        yield env
    finally:
        for p in reversed(procs):  # our own daemons only, by process group
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)  # slurmd can ignore SIGTERM
                p.wait()


def _idle(env) -> int:
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N %t"], env=env, capture_output=True, text=True, timeout=10
    ).stdout
    return sum(1 for line in out.splitlines() if line.split()[-1:] in (["idle"], ["mix"]))


def _wait(cond, timeout: float, what: str) -> None:
    """Polls cond() until it holds; fails naming `what` after `timeout` seconds (a command
    of cond's that hangs counts as not yet)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if cond():
                return
        except subprocess.TimeoutExpired:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the local SLURM cluster did not come up: no {what} within {timeout:.0f} s"
            )
        time.sleep(0.5)
