"""The SLURM launcher: batch scripts written from params, submitted with `sbatch --wait`.

Training: `srun` starts one torchrun per node; the nodes meet at a c10d rendezvous on the
allocation's first node, and each torchrun's node rank is the ledger's node id. Search:
one allocation, `mpirun` inside it starting the MPI search. Every value from params is
shell-quoted, so a space or `;` in one cannot run a command; secrets have no place here
(the environment of `experiments.slurm.env` is written into the script as it is).

Resume on requeue: jobs are submitted with `--requeue`, so a preempted job runs again and
resumes from its last checkpoint. Before the time limit (`stop_before_s`), the trainer
checkpoints at its next checkpoint step and writes DIR/REQUEUE; the script then requeues
the job, which resumes there. SLURM also sends SIGUSR1 to every process of the step
`stop_before_s` before the limit (`--signal`), which the trainer treats alike: it covers a
time limit changed after the job started. A rank that fails is restarted by torchrun, with
every other rank, up to `max_restarts` times; each restart resumes from the last checkpoint.
"""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from abtrain.files import atomic_write_text
from search.launch import mpirun_command

NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
q = shlex.quote


WHOLE_NUMBERS = ("cpus_per_task", "gpus_per_node", "stop_before_s", "search_nodes", "max_restarts")
ONE_LINE = ("partition", "account", "time")


def checked(slurm: dict[str, Any], job_name: str) -> dict[str, Any]:
    """`experiments.slurm` fit for a batch script, or a ValueError naming the key: a
    #SBATCH value is one line (quoting can't carry a newline there: it would end the
    directive and make the rest a command, or drop the directives after it), and counts
    are whole numbers."""
    out = dict(slurm)
    if isinstance(slurm.get("time"), int | float):  # YAML 1.1 reads 12:00:00 as 43200 (s)
        raise ValueError(
            f"experiments.slurm.time: {slurm['time']!r} was read as a number (an unquoted "
            "HH:MM:SS is seconds in YAML 1.1, which Slurm would take as minutes); write "
            "days-hours:minutes:seconds, e.g. 0-00:30:00"
        )
    named = [(f"experiments.slurm.{k}", slurm.get(k)) for k in ONE_LINE]
    for key, value in [*named, ("the run name", job_name)]:
        if value is not None and any(c < " " or c == "\x7f" for c in str(value)):
            raise ValueError(
                f"{key}: {str(value)!r} holds a control character; it must be one line"
            )
    for key in WHOLE_NUMBERS:
        value = slurm.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not str(value).strip().isdigit():
            raise ValueError(f"experiments.slurm.{key}: {value!r} is not a whole number")
        out[key] = int(value)
    return out


def _header(
    slurm: dict[str, Any], job_name: str, nodes: int, tasks_per_node: int, log: Path
) -> list[str]:
    slurm = checked(slurm, job_name)
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={q(job_name)}",
        f"#SBATCH --nodes={int(nodes)}",
        f"#SBATCH --ntasks-per-node={int(tasks_per_node)}",
        f"#SBATCH --cpus-per-task={int(slurm['cpus_per_task'])}",
        f"#SBATCH --time={q(str(slurm['time']))}",
        f"#SBATCH --output={q(str(log))}",
        "#SBATCH --requeue",
    ]
    for key in ("partition", "account"):
        if slurm.get(key):
            lines.append(f"#SBATCH --{key}={q(str(slurm[key]))}")
    if int(slurm.get("gpus_per_node") or 0):
        lines.append(f"#SBATCH --gres=gpu:{int(slurm['gpus_per_node'])}")
    lines += ["set -euo pipefail", f"cd {q(str(Path.cwd()))}"]
    if slurm.get("setup"):
        lines.append(str(slurm["setup"]))  # the user's own activation line, verbatim
    for key, value in (slurm.get("env") or {}).items():
        if not NAME.match(str(key)):
            raise ValueError(f"experiments.slurm.env: {key!r} is not an environment variable name")
        lines.append(f"export {key}={q(str(value))}")
    return lines


def train_script(
    slurm: dict[str, Any],
    nodes: int,
    ranks_per_node: int,
    args: list[str],
    out: Path,
    job_name: str,
) -> str:
    """One run: `python -m abtrain ARGS` on nodes × ranks_per_node ranks."""
    slurm = checked(slurm, job_name)
    lines = _header(slurm, job_name, nodes, 1, out / "slurm-%j.log")
    margin = int(slurm.get("stop_before_s") or 0)
    restarts = int(slurm.get("max_restarts") or 0)
    if margin:
        # No `B:`: SLURM signals every process of the job steps (torchrun and, through the
        # process tracking, its ranks, each in a session of its own), not the batch shell,
        # which waits on srun and could only act once srun has returned.
        lines.insert(lines.index("#SBATCH --requeue") + 1, f"#SBATCH --signal=USR1@{margin}")
    # the task's cores shared among the node's ranks (torchrun sets 1 thread only for several
    # ranks per node; one rank alone would take every core of the machine); env can override
    threads = max(1, int(slurm["cpus_per_task"]) // int(ranks_per_node))
    lines.append(f'export OMP_NUM_THREADS="${{OMP_NUM_THREADS:-{threads}}}"')
    torchrun = " ".join(
        [
            # torchrun would die of SIGUSR1 (its default action) and take the ranks down; an
            # ignored signal stays ignored through exec and fork, and the trainer installs its
            # own handler over it
            'trap "" USR1;',
            "exec",
            "python",
            "-m",
            "torch.distributed.run",
            f"--nnodes={int(nodes)}",
            f"--nproc-per-node={int(ranks_per_node)}",
            "--rdzv-backend=c10d",
            '--rdzv-endpoint="$head:$port"',
            '--rdzv-id="$SLURM_JOB_ID"',
            f"--max-restarts={restarts}",
            "-m",
            "abtrain",
            *[q(a) for a in args],
        ]
    )
    if restarts:
        # one store for every rendezvous round would hand restarted ranks the dead ones'
        # addresses; without sharing, each round's rank 0 serves a fresh one
        lines.append("export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1")
    lines += [
        'first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        'head=$(scontrol show node "$first" | grep -o "NodeAddr=[^ ]*" | cut -d= -f2)',
        "export port=$((20000 + SLURM_JOB_ID % 20000)) head",
        'end=$(scontrol show job "$SLURM_JOB_ID" | grep -o "EndTime=[^ ]*" | cut -d= -f2)',
        f'if end_s=$(date -d "$end" +%s 2>/dev/null); then '
        f"export ABTRAIN_DEADLINE=$((end_s - {margin})); fi",
        f"rm -f {q(str(out / 'REQUEUE'))}",
        f"srun --kill-on-bad-exit=1 bash -c {q(torchrun)}",
        f'if [ -f {q(str(out / "REQUEUE"))} ]; then scontrol requeue "$SLURM_JOB_ID"; fi',
    ]
    return "\n".join(lines) + "\n"


def search_script(
    slurm: dict[str, Any],
    nodes: int,
    ranks_per_node: int,
    args: list[str],
    out: Path,
    job_name: str,
) -> str:
    """The search: one allocation, mpirun with one rank per task inside it, run by
    `python -m search.launch`, so that a job cancelled from outside (`scancel`: SIGTERM to
    every process of the job) ends its log saying how far the search got and how to go on,
    which mpirun's ranks, stopping, can no longer say."""
    lines = _header(slurm, job_name, nodes, ranks_per_node, out / "slurm-%j.log")
    ntasks = '"$SLURM_NTASKS"'  # the allocation's task count: the one word the shell expands
    words = ["python", "-m", "search.launch", *mpirun_command(ntasks, args, here=False)]
    count = words.index("-n") + 1
    lines.append("exec " + " ".join(w if i == count else q(w) for i, w in enumerate(words)))
    return "\n".join(lines) + "\n"


def submit(script_text: str, out: Path, name: str) -> int:
    """Submit and wait. A failed job ends in one line: its id, the cause the first failing
    rank gave (or the exit code) and the log that holds the rest, torchrun's tracebacks
    included."""
    out.mkdir(parents=True, exist_ok=True)
    script = out / "job.sbatch"
    atomic_write_text(script, script_text)
    proc = subprocess.Popen(
        ["sbatch", "--parsable", "--wait", str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # A stage stopped (its dvc killed: SIGTERM; a closed terminal; Ctrl-C) takes its job
    # with it: left queued, the job would train on and write the stage's outputs with no
    # stage to record them.
    stopped: list[int] = []

    def stop(signum: int, _frame: object) -> None:
        stopped.append(signum)
        proc.terminate()  # sbatch --wait ends; the job is cancelled below

    here = threading.current_thread() is threading.main_thread()
    signals = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT) if here else ()
    previous = {sig: signal.signal(sig, stop) for sig in signals}
    try:
        out_text, stderr = proc.communicate()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    job = out_text.strip().split(";")[0] or "?"  # --parsable: the id, printed as it queues
    if stopped:
        if job != "?":
            subprocess.run(["scancel", job], capture_output=True, timeout=60)
        how = signal.Signals(stopped[0]).name
        print(f"[pipeline] stopped ({how}): SLURM job {job} ({name}) cancelled", file=sys.stderr)
        return 128 + stopped[0]
    if proc.returncode:
        logs = sorted(out.glob(f"slurm-{job}.log")) or sorted(out.glob("slurm-*.log"))
        lines = logs[-1].read_text(errors="replace").splitlines() if logs else []
        where = f"its log: {logs[-1]}" if logs else f"no log in {out}"
        print(
            f"error: SLURM job {job} ({name}) failed with exit code {proc.returncode}: "
            f"{job_cause(lines) or _last(stderr) or 'no rank said why'}; {where}",
            file=sys.stderr,
        )
        return proc.returncode or 1
    print(f"[pipeline] SLURM job {job} ({name}) completed", flush=True)
    return 0


def job_cause(lines: list[str]) -> str | None:
    """The first failure a rank gave in a job's log (abtrain's one-line error, or
    `[abtrain] rank N (node M) failed: ...`; srun labels lines `0: `), or None."""
    for line in lines:
        text = re.sub(r"^\s*\d+: ", "", line)  # srun --label
        if text.startswith("error: ") or re.match(r"\[abtrain\] rank \d+ .*failed", text):
            return text.removeprefix("error: ").removeprefix("[abtrain] ")
    return None


def _last(text: str) -> str:
    """The last non-empty line of `text` (sbatch's own refusal), or ''."""
    return next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")


def run_search(p: dict[str, Any], args: list[str], out: Path) -> int:
    try:
        slurm = checked(p["experiments"]["slurm"], "search")
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    nodes = int(slurm["search_nodes"])
    ranks = int(p["search"]["ranks"])
    if ranks % nodes:
        raise SystemExit(
            f"search.ranks={ranks} is not a multiple of experiments.slurm.search_nodes"
        )
    job_dir = out.parent / f"{out.name}-job"  # the search's own folder may not exist yet
    text = search_script(slurm, nodes, ranks // nodes, args, job_dir.resolve(), "search")
    return submit(text, job_dir, "search")


def run_slurm(p: dict[str, Any], run: Any, args: list[str], out: Path) -> int:
    """Train `run` as one SLURM job. What the ranks would refuse (a bad value, a world its
    groups or batch don't fit, data not prepared) is refused here, in one line before any
    job is queued, as the local launcher does."""
    from abtrain.commands.preflight import refusal

    try:
        text = train_script(
            p["experiments"]["slurm"], run.nodes, run.ranks_per_node, args, out.resolve(), run.name
        )
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    world = run.nodes * run.ranks_per_node
    if (why := refusal(args, world, run.ranks_per_node)) is not None:
        print(f"error: {why}", file=sys.stderr, flush=True)
        return 2
    return submit(text, out, run.name)
