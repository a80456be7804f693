"""Faults as they happen in the field: a signal to the launcher's process group, a lost
`LATEST`, a checkpoint cut short, a resume under another world or config, two launches
into one folder. Every case runs the real launcher and torchrun."""

import errno
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from abtrain.run import checkpointer
from tests.helpers import PARAMS, ROOT, TINY, launch, summary

pytestmark = pytest.mark.multiprocess  # every case runs the launcher and torchrun

DDP = ["method=ddp"]


def start(out: Path, *overrides: str, nnodes: int = 2, nproc: int = 1) -> subprocess.Popen:
    """The launcher in a process group of its own, as a shell or batch script starts it."""
    cmd = [sys.executable, "-m", "abtrain.launch", f"--nnodes={nnodes}"]
    cmd += [f"--nproc-per-node={nproc}", "train", "--config", str(PARAMS), "--out", str(out)]
    for o in [*TINY, *overrides]:
        cmd += ["--set", o]
    return subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )


def processes_of(out: Path) -> list[int]:
    """Pids of every live process whose command line names the run folder."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = stat_of(int(entry.name))[0]
        except OSError:
            continue
        if str(out).encode() in cmdline and state != "Z":
            pids.append(int(entry.name))
    return pids


def stat_of(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command's name: state, parent, ..., start time
    (19). Raises for a process that is gone."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def parent_of(pid: int) -> int:
    """Raises for a process that is gone, unlike `abtrain.lifetime`'s (0): the tests signal
    what this finds, and a signal to pid 0 is one to the test's own process group."""
    return int(stat_of(pid)[1])


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.2)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_to_the_launchers_group_stops_every_rank_and_a_second_launch_is_refused(
    tmp_path, sig
):
    first = start(tmp_path, *DDP, "steps=100000", "checkpoint_every=10")
    try:
        wait_for(tmp_path / "checkpoints" / "LATEST", first)
        if sig == signal.SIGTERM:  # refused for the folder's lock, whatever the signal: once
            second = launch(
                tmp_path, *DDP, "steps=100000", "checkpoint_every=10", nnodes=2, nproc=1
            )
            assert second.returncode != 0
            assert f"{tmp_path} is in use by another run" in second.stderr
            assert first.poll() is None  # the refused launch left the running one alone

        os.killpg(first.pid, sig)  # what a CI timeout, `scancel` or Ctrl-C does
        _, err = first.communicate(timeout=60)
        assert first.returncode == 128 + sig
        # one line says what stopped and where the run resumes; no traceback per node
        said = err.decode()
        assert "Traceback" not in said and "SignalException" not in said, said[-3000:]
        step = int((tmp_path / "checkpoints" / "LATEST").read_text())
        assert f"resumes from its checkpoint of step {step} in {tmp_path}" in said, said[-3000:]
        deadline = time.monotonic() + 30
        while processes_of(tmp_path):  # no rank trains on, orphaned
            assert time.monotonic() < deadline, f"{processes_of(tmp_path)} alive 30 s after it"
            time.sleep(0.5)
    finally:
        for pid in processes_of(tmp_path):
            os.kill(pid, signal.SIGKILL)
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)


def test_ctrl_c_while_the_launcher_starts_ends_it_in_one_line(tmp_path):
    """Ctrl-C in the seconds the launcher spends importing torch to check the run (as a
    study's Ctrl-C met it): one line and 130, not a traceback through the import machinery."""
    proc = start(tmp_path, *DDP)
    time.sleep(0.3)  # while it imports (or, on a fast machine, after: either way one line)
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal sends it
    _, err = proc.communicate(timeout=60)
    said = err.decode()
    assert proc.returncode == 128 + signal.SIGINT and "Traceback" not in said, said[-3000:]
    lines = said.strip().splitlines()
    assert lines == ["[abtrain.launch] stopped (Ctrl-C) before any node started"] or (
        "[abtrain.launch] every node stopped;" in lines[-1]
    ), said[-3000:]


@pytest.fixture(scope="module")
def killed_once(tmp_path_factory):
    """A ddp run on 2 ranks killed at step 35; checkpoints at 10, 20, 30 (two kept)."""
    out = tmp_path_factory.mktemp("killed") / "run"
    proc = launch(out, *DDP, env={"ABTRAIN_FAIL_AT": "1:35"}, nnodes=1, nproc=2)
    assert proc.returncode != 0
    assert checkpointer.resume_candidates(out / "checkpoints") == [30, 20]
    return out


@pytest.fixture
def killed(killed_once, tmp_path):
    """A copy of the killed run's folder for each test to damage as it likes: the run is
    killed once for them all (each test used to kill one of its own)."""
    out = tmp_path / "run"
    shutil.copytree(killed_once, out, symlinks=True)
    return out


def test_a_lost_latest_resumes_from_the_newest_whole_checkpoint(killed):
    (killed / "checkpoints" / "LATEST").unlink()
    resumed = launch(killed, *DDP, nnodes=1, nproc=2)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from step 30" in resumed.stdout
    assert checkpointer.whole_steps(killed / "checkpoints") == [30, 40]
    assert summary(killed)["steps"] == 40


def test_a_truncated_checkpoint_is_named_and_the_one_before_it_used(killed):
    bad = checkpointer.step_dir(killed / "checkpoints", 30) / "replica_0.pt"
    bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])  # a crash mid-copy
    resumed = launch(killed, *DDP, nnodes=1, nproc=2)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"{bad} is damaged" in resumed.stderr  # its recorded sha256 tells first
    assert "resumed from step 20" in resumed.stdout


def test_resuming_under_another_world_size_is_refused(killed):
    resumed = launch(killed, *DDP, nnodes=1, nproc=1)
    assert resumed.returncode != 0
    assert "was written by 2 ranks on 1 nodes, this run has 1 on 1" in resumed.stderr
    assert checkpointer.resume_candidates(killed / "checkpoints") == [30, 20]  # nothing lost


def test_a_deleted_config_json_does_not_let_another_config_resume(killed):
    (killed / "config.json").unlink()
    resumed = launch(killed, *DDP, "optim.lr=0.1", nnodes=1, nproc=2)
    assert resumed.returncode != 0
    assert "another config (optim.lr differ)" in resumed.stderr
    assert checkpointer.resume_candidates(killed / "checkpoints") == [30, 20]


def test_a_rank_that_dies_is_restarted_by_torchrun_and_the_run_ends_as_an_uninterrupted_one(
    tmp_path,
):
    """`--max-restarts`: rank 1 (node 1 of 2) dies at step 25, inside an AB phase; torchrun
    restarts every rank of both nodes (c10d rendezvous), they resume from step 20, and the
    run ends with the summary of a run that never failed."""

    def run(out: Path, restarts: int, env: dict) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "abtrain.launch", "--nnodes=2", "--nproc-per-node=1"]
        cmd += [f"--max-restarts={restarts}", "train", "--config", str(PARAMS), "--out", str(out)]
        for o in [*TINY, "method=ab"]:
            cmd += ["--set", o]
        return subprocess.run(
            cmd, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=240
        )

    plain = run(tmp_path / "plain", 0, {})
    assert plain.returncode == 0, plain.stderr[-3000:]
    hit = run(tmp_path / "hit", 1, {"ABTRAIN_FAIL_AT": "1:25"})
    assert hit.returncode == 0, hit.stderr[-3000:]
    assert "rank 1: injected failure at step 25" in hit.stderr
    assert "resumed from step 20 (ab phase)" in hit.stdout
    a, b = summary(tmp_path / "plain"), summary(tmp_path / "hit")
    assert b["nodes"] == 2 and b["steps"] == 40
    assert a["train_loss_final"] == b["train_loss_final"]
    assert [e["val_top1"] for e in a["evals"]] == [e["val_top1"] for e in b["evals"]]
    assert a["traffic"]["inter_node_bytes"] == b["traffic"]["inter_node_bytes"]


@pytest.mark.parametrize("method, every", [("ddp", 1), ("ab", 1), ("ab", 10)])
def test_a_diverging_run_stops_at_the_step_naming_it_before_a_checkpoint_of_it(
    tmp_path, method, every
):
    """lr 1e30 (read as the number it is): step 0's update blows the weights up and step 1's
    loss is not finite. The run stops there on every rank, naming the step, and the only
    checkpoint is the whole one before it (ab: the warm-up's); its last line says which,
    or that there is none yet."""
    out = tmp_path / "run"
    proc = launch(
        out, f"method={method}", "optim.lr=1e30", "optim.lr_warmup_steps=0",
        f"checkpoint_every={every}", "keep_checkpoints=5", "tracking.enabled=false",
        nnodes=2, nproc=1,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "TrainingDiverged: step 1 (warmup phase)" in proc.stderr or (
        method == "ddp" and "TrainingDiverged: step 1 (full phase)" in proc.stderr
    ), proc.stderr[-3000:]
    assert "not finite" in proc.stderr
    assert not (out / "summary.json").exists()
    saved = sorted(int(p.name.split("_")[-1]) for p in (out / "checkpoints").glob("step_*"))
    assert saved == ([1] if every == 1 else []), saved  # nothing of step 1 or later
    last = proc.stderr.strip().splitlines()[-1]
    kept = "its last checkpoint, of step 1, is whole" if every == 1 else "no checkpoint had"
    assert "not finite" in last and kept in last, last


def test_a_checkpoint_damaged_on_disk_is_named_and_the_one_before_it_used(killed):
    """64 bytes flipped in the middle of the newest replica file: same size, meta.json
    untouched, and torch.load would read it without a word. The sha256 recorded when the
    checkpoint was published tells, and the resume falls back to the newest whole one."""
    bad = checkpointer.step_dir(killed / "checkpoints", 30) / "replica_0.pt"
    data = bytearray(bad.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
    bad.write_bytes(bytes(data))
    resumed = launch(killed, *DDP, nnodes=1, nproc=2)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"{bad} is damaged: its sha256 differs" in resumed.stderr
    assert "resumed from step 20" in resumed.stdout


@pytest.fixture
def small_disk(tmp_path):
    """A real filesystem of a size we choose (tmpfs), where this machine lets us mount one."""
    mnt = tmp_path / "disk"
    mnt.mkdir()

    def mount(size: int, again: bool = False) -> None:
        opts = f"{'remount,' if again else ''}size={size}"
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(mnt)])
        if proc.returncode:
            pytest.skip("no tmpfs can be mounted here (needs root)")

    yield mnt, mount
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_full_disk_at_a_checkpoint_names_the_file_leaves_no_temporary_and_resumes(
    tmp_path, small_disk
):
    """The disk fills while a checkpoint is written: the run stops with one line
    naming ENOSPC and the file, leaves no temporary file, keeps the ones before it whole,
    and resumes from the newest once there is room."""
    reference = launch(tmp_path / "ref", *DDP, nnodes=1, nproc=2)
    assert reference.returncode == 0, reference.stderr[-2000:]
    ckpts = tmp_path / "ref" / "checkpoints"
    one = sum(p.stat().st_size for p in checkpointer.step_dir(ckpts, 40).iterdir())
    rest = sum(
        p.stat().st_size
        for p in (tmp_path / "ref").rglob("*")
        if p.is_file() and "checkpoints" not in p.parts
    )
    mnt, mount = small_disk
    mount(int(1.5 * one + rest + 64 * 1024))  # room for one checkpoint, not for two
    out = mnt / "run"
    full = launch(out, *DDP, nnodes=1, nproc=2)
    assert full.returncode != 0
    assert "No space left on device (ENOSPC)" in full.stderr, full.stderr[-3000:]
    # each rank names the file it could not write: its replica's, or its own
    failed = re.findall(r"could not write (\S+)/step_(\d+)/\S+: No space left", full.stderr)
    assert failed, full.stderr[-3000:]
    step = int(failed[0][1])
    assert "enforce fail" not in full.stderr  # torch's own words stay out of sight
    assert not [p for p in out.rglob("*") if ".tmp" in p.name]  # nothing half-written left
    before = checkpointer.resume_candidates(out / "checkpoints")
    assert before and max(before) < step  # the checkpoints before it are whole
    mount(64 << 20, again=True)  # room again
    resumed = launch(out, *DDP, nnodes=1, nproc=2)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from step {max(before)}" in resumed.stdout
    assert summary(out)["steps"] == 40


def fill(folder: Path) -> None:
    """Writes a file into `folder` until its disk is full. Full already is as good: once a
    CI run found no room left even to create the file (the run's own files had filled it)."""
    try:
        f = open(folder / "filler", "wb")
    except OSError as err:
        if err.errno != errno.ENOSPC:
            raise
        return
    with f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass


def test_a_disk_that_fills_under_the_logs_still_ends_with_the_cause(tmp_path, small_disk):
    """Something else fills the disk once the run has started, so the nodes' logs can't be
    written either (CI met it): the launcher relays the ranks' lines all the same and its
    last line names the full disk and the logs it could not write, with no traceback."""
    mnt, mount = small_disk
    mount(16 << 20)
    out = mnt / "run"
    proc = start(out, *DDP, "steps=100000", nnodes=1, nproc=2)
    deadline = time.monotonic() + 120
    while not (out / "train_log.csv").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    fill(mnt)
    err = proc.communicate(timeout=120)[1].decode()
    assert proc.returncode != 0
    last = err.strip().splitlines()[-1]
    assert last.startswith("[abtrain.launch] error: "), err[-3000:]
    assert "No space left on device" in last, err[-3000:]
    assert "could not be written" in last, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert "node None" not in err


def gone(out: Path, timeout: float) -> list[int]:
    """Waits for every process of the run to end; returns those still alive."""
    deadline = time.monotonic() + timeout
    while processes_of(out) and time.monotonic() < deadline:
        time.sleep(0.5)
    return processes_of(out)


def test_a_launcher_killed_outright_leaves_no_node_or_rank_training(tmp_path):
    """`kill -9` of the launcher (the OOM killer, a lost login shell): it can pass nothing
    on, yet every torchrun and rank stops, and the checkpoint stays for a resume."""
    first = start(tmp_path, *DDP, "steps=100000", "checkpoint_every=10")
    try:
        wait_for(tmp_path / "checkpoints" / "LATEST", first)
        assert len(processes_of(tmp_path)) >= 5  # the launcher, 2 torchruns, 2 ranks
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
        assert gone(tmp_path, 60) == [], "processes of the run alive 60 s after the kill"
        assert checkpointer.resume_candidates(tmp_path / "checkpoints")
    finally:
        for pid in processes_of(tmp_path):
            os.kill(pid, signal.SIGKILL)


def test_a_nodes_torchrun_killed_outright_ends_the_run_at_once_saying_so(tmp_path):
    """`kill -9` of one node's torchrun: its rank goes with it, the launcher stops the
    other node at once and returns 128 + 9, naming the node and the signal."""
    first = start(tmp_path, *DDP, "steps=100000", "checkpoint_every=10")
    try:
        wait_for(tmp_path / "checkpoints" / "LATEST", first)
        torchrun, *ranks = node_processes(first.pid, tmp_path, 1)
        assert len(ranks) == 1, ranks
        t0 = time.monotonic()
        os.kill(torchrun, signal.SIGKILL)
        _, err = first.communicate(timeout=60)
        assert first.returncode == 128 + signal.SIGKILL, err.decode()[-3000:]
        assert "node 1's torchrun was killed by SIGKILL" in err.decode()
        assert time.monotonic() - t0 < 45  # not the peers' collective timeout and more
        assert gone(tmp_path, 30) == [], "processes of the run alive 30 s after the kill"
    finally:
        for pid in processes_of(tmp_path):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize(
    "bad",
    [
        ["--set", "steps=-5"],
        ["--set", "batch_size=0"],
        ["--set", "eval_every=0"],
        ["--set", "checkpoint_every=-1"],
        ["--bogus"],  # a mistyped argument
        ["--set", "optim.lr"],  # a --set without a value
    ],
    ids=["steps", "batch_size", "eval_every", "checkpoint_every", "argument", "set"],
)
def test_the_launcher_refuses_a_bad_value_in_one_line_before_any_torchrun(tmp_path, bad):
    """Exit code 2 and one line, as `abtrain check`; nothing of torchrun on screen (it never
    started: its ranks would each print the error, and torchrun its report) and no run
    folder written."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "abtrain.launch", "--nnodes=2", "--nproc-per-node=1", "train"]
    cmd += ["--config", str(PARAMS), "--out", str(out), *bad]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    key = bad[-1].lstrip("-").split("=")[0]
    assert key in lines[0], lines
    assert not out.exists()


@pytest.mark.parametrize(
    "shape, bad, said",
    [
        (["--nnodes=0"], [], "argument --nnodes: 0 is below 1"),
        (["--nproc-per-node=x"], [], "argument --nproc-per-node: 'x' is not a whole number"),
        (["--max-restarts=-1"], [], "argument --max-restarts: -1 is below 0"),
        # what only the world shows: AB's groups on one node, a global batch over the data
        (["--nnodes=1", "--nproc-per-node=2"], ["method=ab"], "gives 1 group on 2 ranks"),
        (
            ["--nnodes=2", "--nproc-per-node=1"],
            ["batch_size=1500"],
            "global batch of 3000, more than the 2000 training samples",
        ),
    ],
    ids=["nnodes", "nproc", "restarts", "groups", "global-batch"],
)
def test_the_launcher_refuses_its_own_arguments_and_the_worlds_misfits_in_one_line(
    tmp_path, shape, bad, said
):
    """Once each, before torchrun: not a usage text or a ZeroDivisionError, not each rank
    saying it and the launcher then calling a rank silent; no run folder written."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "abtrain.launch", *shape, "train"]
    cmd += ["--config", str(PARAMS), "--out", str(out)]
    for o in [*TINY, *bad]:
        cmd += ["--set", o]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and said in lines[0], lines
    assert not out.exists()


def children_of(pid: int, out: Path) -> list[int]:
    """The run's processes whose parent is `pid`, oldest first (forked in one clock tick:
    by pid)."""
    kids = []
    for child in processes_of(out):
        try:
            fields = stat_of(child)
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append((int(fields[19]), child))
    return [child for _, child in sorted(kids)]


def node_processes(launcher: int, out: Path, node: int) -> list[int]:
    """One node of the run: its torchrun (the launcher starts node N's N-th) and the ranks
    that torchrun started. A forked rank's /proc/PID/environ is its launcher's, so it is
    found by its parent."""
    torchrun = children_of(launcher, out)[node]
    return [torchrun, *children_of(torchrun, out)]


@pytest.mark.parametrize("node", [1, 0], ids=["node1", "node0-the-store"])
def test_a_node_that_stops_answering_ends_the_run_within_the_timeout_naming_it(tmp_path, node):
    """A node frozen (SIGSTOP: a hung machine), node 0 being the one whose torchrun holds
    the rendezvous store: the other node's ranks give up at the collective timeout; the
    launcher then kills the frozen node at once and its last line names it."""
    timeout = 10
    first = start(
        tmp_path, *DDP, "steps=100000", "checkpoint_every=10", f"dist.timeout_s={timeout}"
    )
    try:
        wait_for(tmp_path / "checkpoints" / "LATEST", first)
        frozen = node_processes(first.pid, tmp_path, node)
        assert len(frozen) == 2  # its torchrun and its rank
        t0 = time.monotonic()
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        _, err = first.communicate(timeout=180)
        took = time.monotonic() - t0
        text = err.decode()
        last = text.strip().splitlines()[-1]
        assert first.returncode not in (0, None)
        assert last.startswith("[abtrain.launch] error: rank "), last
        assert f"node {node} did not answer" in last and f"{tmp_path}/logs/node-*.log" in last
        assert "Traceback" not in text  # the tracebacks are in the logs
        assert "Traceback" in (tmp_path / "logs" / f"node-{1 - node}.log").read_text()
        assert took < timeout + 15, took  # the timeout, the grace, and the kill
        assert gone(tmp_path, 30) == [], "processes of the run alive after the end"
    finally:
        for pid in processes_of(tmp_path):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)


def test_a_failure_inside_the_ranks_ends_in_one_line_and_its_traceback_in_a_log(tmp_path):
    """A model that only the ranks find they can't build: one line at the end naming the
    rank and the cause; torchrun's ChildFailedError and the tracebacks only in the logs."""
    broken = "model={name: python, factory: 'not_here:f', kwargs: {}, init: default}"
    done = start(tmp_path, broken)
    _, err = done.communicate(timeout=180)
    text = err.decode()
    last = text.strip().splitlines()[-1]
    assert done.returncode == 1
    assert last.startswith("[abtrain.launch] error: rank ") and "not_here" in last, last
    assert "Traceback" not in text and "ChildFailedError" not in text
    logs = "".join(p.read_text() for p in (tmp_path / "logs").glob("node-*.log"))
    assert "Traceback" in logs and "ChildFailedError" in logs


def refused(out: Path, *overrides: str) -> tuple[int, list[str]]:
    """The launcher on a run that must not start: its exit code and stderr lines."""
    cmd = [sys.executable, "-m", "abtrain.launch", "--nnodes=2", "--nproc-per-node=1", "train"]
    cmd += ["--config", str(PARAMS), "--out", str(out)]
    for o in [*TINY, *overrides]:
        cmd += ["--set", o]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    return done.returncode, done.stderr.splitlines()


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("mount") is None, reason="a bind mount needs root"
)
def test_a_read_only_run_folder_is_refused_in_one_line_naming_it(tmp_path):
    """A read-only bind mount (a dataset volume, a full quota's remount): the folder itself
    and a new folder in it are refused before any torchrun, naming the path."""
    src, ro = tmp_path / "src", tmp_path / "ro"
    src.mkdir()
    ro.mkdir()
    subprocess.run(["mount", "--bind", str(src), str(ro)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(ro)], check=True)
        for out in (ro, ro / "run"):
            code, lines = refused(out)
            assert code == 2 and len(lines) == 1, lines
            assert f"--out {out}: the run can't write there (Read-only file system)" in lines[0]
        assert list(src.iterdir()) == []
    finally:
        subprocess.run(["umount", str(ro)], check=True)


def mlflow_store(path: Path) -> None:
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri=f"sqlite:///{path}").create_experiment("abtrain")


@pytest.mark.parametrize("damage", ["cut in half", "bytes flipped"])
def test_a_damaged_tracking_store_is_refused_in_one_line_naming_it(tmp_path, damage):
    """An mlflow.db cut short (a copy interrupted) or with a page's bytes flipped on disk:
    named as damaged (not as unreachable, nor used without a word) before any torchrun,
    with the command that sets it aside; no run folder left behind."""
    import sqlite3

    db = tmp_path / "mlflow.db"
    mlflow_store(db)
    data = bytearray(db.read_bytes())
    if damage == "cut in half":
        data = data[: len(data) // 2]
    else:  # the header of the page holding the experiments table, in the file's middle
        with sqlite3.connect(db) as c:
            size = c.execute("PRAGMA page_size").fetchone()[0]
            root = c.execute("SELECT rootpage FROM sqlite_master WHERE name='experiments'")
            at = (root.fetchone()[0] - 1) * size
        assert 0 < at < len(data) - size
        data[at : at + 16] = bytes(b ^ 0xFF for b in data[at : at + 16])
    db.write_bytes(bytes(data))
    out = tmp_path / "run"
    code, lines = refused(out, "tracking.enabled=true", f"tracking.uri=sqlite:///{db}")
    assert code == 2 and len(lines) == 1, lines
    assert f"tracking store {db} is damaged" in lines[0] and f"mv {db} {db}.damaged" in lines[0]
    assert "can't be reached" not in lines[0]
    assert not out.exists()


def test_a_rendezvous_port_another_process_holds_is_named_on_the_last_line(
    tmp_path, monkeypatch, capfd
):
    """Another process takes the port between the launcher's pick and node 0's torchrun
    listening on it (a race two launches at once can lose): the last line names the port,
    and does not blame node 1, which was only waiting to meet."""
    from abtrain.commands import localrun as launcher

    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_A_PORT], stdout=subprocess.PIPE, text=True
    )
    try:
        port = int(holder.stdout.readline())
        monkeypatch.setattr(launcher, "free_port", lambda: port)
        args = ["train", "--config", str(PARAMS), "--out", str(tmp_path / "run")]
        for o in TINY:
            args += ["--set", o]
        code = launcher.run_local(2, 1, args)
    finally:
        holder.kill()
        holder.wait()
    assert code != 0
    last = capfd.readouterr().err.strip().splitlines()[-1]
    assert f"rendezvous port 127.0.0.1:{port} is in use by another process" in last, last
    assert "did not answer" not in last, last


HOLD_A_PORT = """
import socket, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen()
print(s.getsockname()[1], flush=True)
time.sleep(600)
"""
