"""The SLURM launcher against a real local SLURM cluster (slurmctld + two slurmd nodes)."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline import slurm
from pipeline.matrix import MatrixRun
from tests import slurm_cluster
from tests.helpers import PARAMS, ROOT, TINY, launch, summary

pytestmark = pytest.mark.skipif(
    not slurm_cluster.available(), reason="Debian's slurmctld/slurmd/slurm-client are not installed"
)

BIN = Path(sys.executable).parent
SLURM = {
    "partition": None,
    "account": None,
    "time": "00:10:00",
    "gpus_per_node": 0,
    "cpus_per_task": 1,
    "stop_before_s": 60,
    "search_nodes": 2,
    "setup": f"export PATH={BIN}:$PATH",
    "env": {"OMP_NUM_THREADS": "1"},
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with slurm_cluster.local_cluster(tmp_path_factory.mktemp("slurm")) as env:
        yield env


@pytest.fixture
def in_cluster(cluster, monkeypatch):
    """sbatch and friends reach the test cluster; the job runs in the repository."""
    monkeypatch.setenv("SLURM_CONF", cluster["SLURM_CONF"])
    monkeypatch.chdir(ROOT)
    return cluster


def train_args(out: Path, *extra: str) -> list[str]:
    args = ["train", "--config", str(PARAMS), "--out", str(out)]
    for o in [*TINY, *extra]:
        args += ["--set", o]
    return args


def in_queue(job: str) -> bool:
    """Whether squeue still lists the job (a squeue that hangs fails the test in 30 s)."""
    return bool(
        subprocess.run(
            ["squeue", "-h", "-j", job], capture_output=True, text=True, timeout=30
        ).stdout.strip()
    )


def cancel(job: str, seconds: float) -> None:
    """`scancel` the job as a user does, and wait until squeue no longer lists it."""
    subprocess.run(["scancel", job], check=True, timeout=30)
    deadline = time.monotonic() + seconds
    while in_queue(job):
        assert time.monotonic() < deadline, f"job {job} still in squeue {seconds} s after scancel"
        time.sleep(0.5)


def p_with(slurm_cfg=SLURM):
    return {"experiments": {"slurm": slurm_cfg}}


@pytest.mark.cluster
@pytest.mark.multiprocess
def test_two_node_ab_job_completes_with_two_node_traffic(in_cluster, tmp_path):
    run = MatrixRun("ab-2x2", "ab", nodes=2, ranks_per_node=2, batch="local")
    out = tmp_path / "slurm-run"
    assert slurm.run_slurm(p_with(), run, train_args(out, "method=ab"), out) == 0
    s = summary(out)
    assert s["nodes"] == 2 and s["world_size"] == 4
    local = launch(tmp_path / "local-run", "method=ab")  # the same run, local launcher
    assert local.returncode == 0, local.stderr[-2000:]
    assert (
        s["traffic"]["inter_node_bytes"]
        == summary(tmp_path / "local-run")["traffic"]["inter_node_bytes"]
        > 0
    )


@pytest.mark.cluster
@pytest.mark.multiprocess
def test_a_failing_job_ends_in_one_line_naming_the_job_the_cause_and_its_log(
    in_cluster, tmp_path, capsys
):
    """A model only the ranks find they can't build: the stage's last word is one line (job,
    cause, log); torchrun's tracebacks stay in the job's log."""
    run = MatrixRun("bad", "ab", nodes=2, ranks_per_node=1, batch="local")
    out = tmp_path / "bad"
    broken = "model={name: python, factory: 'not_here:f', kwargs: {}, init: default}"
    code = slurm.run_slurm(p_with(), run, train_args(out, broken), out)
    err = capsys.readouterr().err
    assert code != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert re.match(r"error: SLURM job \d+ \(bad\) failed with exit code \d+: rank \d", lines[0])
    log = next(out.glob("slurm-*.log"))
    assert "not_here" in lines[0] and lines[0].endswith(f"its log: {log}")
    assert "Traceback" in log.read_text()


@pytest.mark.cluster
@pytest.mark.multiprocess
def test_cancelled_job_resubmitted_resumes_from_its_checkpoint(in_cluster, tmp_path):
    run = MatrixRun("long", "ddp", nodes=2, ranks_per_node=1, batch="local")
    out = tmp_path / "long"
    args = train_args(out, "method=ddp", "steps=400", "checkpoint_every=20", "eval_every=100")
    script = slurm.train_script(SLURM, 2, 1, args, out, "long")
    out.mkdir(parents=True)
    (out / "job.sbatch").write_text(script)
    job = subprocess.run(
        ["sbatch", "--parsable", str(out / "job.sbatch")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    deadline = time.monotonic() + 180
    while not (out / "checkpoints" / "LATEST").exists():
        assert time.monotonic() < deadline, f"job {job} wrote no checkpoint in 180 s"
        time.sleep(0.5)
    cancel(job, 120)
    saved = int((out / "checkpoints" / "LATEST").read_text())
    assert 0 < saved < 400 and not (out / "summary.json").exists()
    assert slurm.run_slurm(p_with(), run, args, out) == 0
    logs = "".join(p.read_text() for p in out.glob("slurm-*.log"))
    assert "resumed from step" in logs and summary(out)["steps"] == 400


@pytest.mark.cluster
@pytest.mark.multiprocess
def test_a_stage_stopped_while_its_job_runs_cancels_the_job(in_cluster, tmp_path):
    """The stage's process gets SIGTERM (what its dvc's death sends it, or scancel of the
    stage, or a closed terminal): the job it waits on leaves the queue and its ranks stop,
    rather than training on to write outputs no stage records; one line says so."""
    out = tmp_path / "stopped"
    args = train_args(out, "method=ddp", "steps=50000", "checkpoint_every=0", "eval_every=50000")
    stage = (
        "import json, sys\nfrom pathlib import Path\nfrom pipeline import slurm\n"
        "from pipeline.matrix import MatrixRun\n"
        "p, args, out = json.loads(sys.argv[1])\n"
        "run = MatrixRun('stopped', 'ddp', nodes=2, ranks_per_node=1, batch='local')\n"
        "sys.exit(slurm.run_slurm(p, run, args, Path(out)))\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", stage, json.dumps([p_with(), args, str(out)])],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 180

    def training() -> bool:  # the ranks are past their start: "step 0: enter full phase"
        return any(
            "step 0: enter" in x.read_text(errors="replace") for x in out.glob("slurm-*.log")
        )

    while not training():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the job did not start training in 180 s"
        time.sleep(0.5)
    (log,) = out.glob("slurm-*.log")
    job = log.stem.removeprefix("slurm-")
    assert in_queue(job)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM
    assert err.strip().splitlines()[-1] == (
        f"[pipeline] stopped (SIGTERM): SLURM job {job} (stopped) cancelled"
    )
    deadline = time.monotonic() + 120
    while in_queue(job):
        assert time.monotonic() < deadline, f"job {job} still in squeue 120 s after the stop"
        time.sleep(0.5)
    assert not (out / "summary.json").exists()


@pytest.mark.cluster
@pytest.mark.multiprocess
def test_time_limit_checkpoints_and_requeues(in_cluster, tmp_path):
    """ABTRAIN_DEADLINE passed: the run stops at its next checkpoint and asks for a requeue."""
    out = tmp_path / "limit"
    cfg = {**SLURM, "time": "00:10:00", "stop_before_s": 10_000}  # the deadline is past at once
    args = train_args(out, "method=ddp", "steps=60", "checkpoint_every=20")
    text = slurm.train_script(cfg, 2, 1, args, out, "limit")
    text = text.replace('scontrol requeue "$SLURM_JOB_ID"', "echo REQUEUED")  # one round only
    assert slurm.submit(text, out, "limit") == 0
    log = "".join(p.read_text() for p in out.glob("slurm-*.log"))
    assert "stopped at the checkpoint of step 20 to be requeued" in log and "REQUEUED" in log
    assert (out / "checkpoints" / "LATEST").read_text().strip() == "20"


def test_generated_scripts_quote_every_value(tmp_path):
    evil = {**SLURM, "partition": "gpu; rm -rf /", "env": {"NCCL_SOCKET_IFNAME": "ib0 $(id)"}}
    text = slurm.train_script(evil, 2, 4, ["train", "--set", "seed=1; echo x"], tmp_path, "a b")
    assert "#SBATCH --partition='gpu; rm -rf /'" in text
    assert "export NCCL_SOCKET_IFNAME='ib0 $(id)'" in text
    assert "#SBATCH --job-name='a b'" in text
    assert "'seed=1; echo x'" in text
    with pytest.raises(ValueError, match="not an environment variable name"):
        slurm.train_script({**SLURM, "env": {"A;B": "1"}}, 1, 1, [], tmp_path, "x")


def test_each_rank_gets_its_share_of_the_task_cores(tmp_path):
    four = {**SLURM, "cpus_per_task": 16, "env": {}}
    assert 'export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"' in slurm.train_script(
        four, 2, 4, ["train"], tmp_path, "x"
    )
    one = slurm.train_script({**SLURM, "env": {}}, 2, 1, ["train"], tmp_path, "x")
    assert 'export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"' in one


def search_args(out: Path, evaluations: int) -> list[str]:
    """A small Optuna search on 4 ranks, 2 a worker: what follows `python -m search`."""
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return [
        "--backend",
        "optuna",
        "--out",
        str(out),
        "--set",
        f"search.evaluations={evaluations}",
        "--set",
        "search.ranks_per_worker=2",
        "--set",
        "search.train=[method=ab, steps=12, eval_every=4, checkpoint_every=0, ab.warmup_steps=2, "
        '"model={name: mlp, width: 32, depth: 3, init: default}", '
        '"data={name: synthetic, features: 16, classes: 4, train_samples: 400, val_samples: 80}"]',
        "--set",
        "train.tracking.enabled=false",
    ]


@pytest.mark.cluster
@pytest.mark.multiprocess
def test_the_search_runs_as_one_slurm_job_with_mpi_inside(in_cluster, tmp_path):
    out = tmp_path / "search"
    params = {"search": {"ranks": 4}, "experiments": {"slurm": SLURM}}
    assert slurm.run_search(params, search_args(out, 2), out) == 0
    best = json.loads((out / "best.json").read_text())
    assert best["evaluations"] == 2
    rows = [json.loads(line) for line in (out / "evaluations.jsonl").read_text().splitlines()]
    assert {r["worker"] for r in rows} <= {0, 1}


@pytest.mark.cluster
@pytest.mark.multiprocess
def test_a_search_job_cancelled_from_outside_ends_its_log_saying_how_far_it_got(
    in_cluster, tmp_path
):
    """`scancel` of a running search job, as a user or an admin does it (SIGTERM to every
    process of the job, SIGKILL KillWait later): the job's log ends with the search's stop
    line, the evaluations kept and how to go on; mpirun's ranks, stopping, can't say it."""
    from search import record

    out, job_dir = tmp_path / "search", tmp_path / "search-job"
    job_dir.mkdir()
    script = job_dir / "job.sbatch"
    script.write_text(slurm.search_script(SLURM, 2, 2, search_args(out, 40), job_dir, "search"))
    assert 'exec python -m search.launch mpirun -n "$SLURM_NTASKS"' in script.read_text()
    job = subprocess.run(
        ["sbatch", "--parsable", str(script)], capture_output=True, text=True, timeout=30
    ).stdout.strip()
    assert job.isdigit(), job
    deadline = time.monotonic() + 180
    while not record.evaluations(out):
        assert in_queue(job), [x.read_text() for x in job_dir.glob("slurm-*.log")]
        assert time.monotonic() < deadline, "no evaluation on disk in 180 s"
        time.sleep(0.5)
    cancel(job, 60)
    (log,) = job_dir.glob("slurm-*.log")
    kept = len(record.evaluations(out))
    assert 1 <= kept < 40
    # the job's processes write the log at offsets of their own: a NUL can pad a gap
    text = log.read_text(errors="replace").replace("\x00", "")
    assert text.strip().splitlines()[-1] == (
        f"[search] stopped by SIGTERM after {kept} evaluations, kept in {out}: "
        "the same command continues it"
    )


@pytest.mark.cluster
@pytest.mark.multiprocess
def test_sigusr1_before_the_limit_reaches_the_ranks_through_torchrun(in_cluster, tmp_path):
    """The batch script asks SLURM for SIGUSR1 `stop_before_s` before the time limit; sent
    to the job's steps (as SLURM does then), it must reach the trainer ranks without killing
    torchrun: the run checkpoints, stops and asks for a requeue."""
    out = tmp_path / "signalled"
    cfg = {**SLURM, "stop_before_s": 75, "max_restarts": 1}
    args = train_args(out, "method=ddp", "steps=100000", "checkpoint_every=10", "eval_every=1000")
    text = slurm.train_script(cfg, 2, 1, args, out, "signalled")
    assert "#SBATCH --signal=USR1@75\n" in text  # matched to stop_before_s, steps not batch
    assert "--max-restarts=1" in text and "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in text
    assert 'trap "" USR1; exec python -m torch.distributed.run' in text
    text = text.replace('scontrol requeue "$SLURM_JOB_ID"', "echo REQUEUED")  # one round only
    out.mkdir(parents=True)
    (out / "job.sbatch").write_text(text)
    job = subprocess.run(
        ["sbatch", "--parsable", str(out / "job.sbatch")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    try:
        deadline = time.monotonic() + 180
        while not (out / "checkpoints" / "LATEST").exists():
            assert time.monotonic() < deadline, f"job {job} wrote no checkpoint in 180 s"
            time.sleep(0.5)
        subprocess.run(["scancel", "--signal=USR1", job], check=True)
        deadline = time.monotonic() + 120
        while in_queue(job):
            assert time.monotonic() < deadline, f"job {job} still in squeue 120 s after SIGUSR1"
            time.sleep(0.5)
    finally:
        subprocess.run(["scancel", job], timeout=30)
    log = "".join(p.read_text() for p in out.glob("slurm-*.log"))
    stopped = re.search(r"stopped at the checkpoint of step (\d+) to be requeued", log)
    assert stopped and "REQUEUED" in log, log[-3000:]
    assert (out / "checkpoints" / "LATEST").read_text().strip() == stopped.group(1)
    assert (out / "REQUEUE").read_text().strip() == stopped.group(1)
    # "REQUEUED" also says srun returned 0 under `set -e`: torchrun survived the signal
