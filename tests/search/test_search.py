"""The search for real: `mpirun -n 4 python -m mpi4py -m search`, killed and resumed."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from search import record, space
from search.driver import main
from tests.conftest import ROOT

MPIRUN = Path(sys.executable).parent / "mpirun"
TINY_TRAIN = (
    "search.train=[method=ab, steps=24, eval_every=8, checkpoint_every=0, ab.warmup_steps=4, "
    '"model={name: mlp, width: 64, depth: 3, init: default}", '
    '"data={name: synthetic, features: 64, classes: 10, train_samples: 2000, val_samples: 400}"]'
)


def search_cmd(out: Path, db: Path, backend: str, evaluations: int, *extra: str, n: int = 4):
    return [
        str(MPIRUN),
        "-n",
        str(n),
        "--oversubscribe",
        "--bind-to",
        "none",
        sys.executable,
        "-m",
        "mpi4py",
        "-m",
        "search",
        "--backend",
        backend,
        "--out",
        str(out),
        "--set",
        f"search.evaluations={evaluations}",
        "--set",
        TINY_TRAIN,
        "--set",
        f"train.tracking.uri=sqlite:///{db}",
        *extra,
    ]


ENV = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def run(cmd, timeout=300):
    return subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)


def kill_after(cmd, out: Path, rows: int, timeout=240):
    """Start the search, and SIGKILL the whole job once `rows` evaluations are on disk."""
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout
    try:
        while len(record.evaluations(out)) < rows:
            assert proc.poll() is None, "the search ended before it could be killed"
            assert time.monotonic() < deadline, "no evaluations in time"
            time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.parametrize("backend", ["propulate", "optuna"])
def test_search_is_killed_resumed_and_leaves_best_config_and_mlflow_runs(tmp_path, backend):
    out, db = tmp_path / "search", tmp_path / "mlflow.db"
    budget = 8
    cmd = search_cmd(out, db, backend, budget)
    kill_after(cmd, out, rows=2)
    killed = len(record.evaluations(out))
    assert 2 <= killed < budget and not (out / "best.json").exists()
    if backend == "propulate":
        assert (out / "checkpoints" / "island_0_ckpt.pickle").exists()
    else:
        assert (out / "optuna.journal").exists()

    again = run(cmd)  # without --resume: refused, nothing touched
    assert again.returncode != 0 and "pass --resume" in again.stderr
    other = run(search_cmd(out, db, backend, budget, "--resume", n=2))
    assert other.returncode != 0 and "world_size" in other.stderr  # another rank count

    resumed = run(cmd + ["--resume"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = record.evaluations(out)
    assert len(rows) >= budget and len(rows) <= budget + 2  # budget, plus at most a re-run
    assert all(r["status"] in record.STATUSES for r in rows)
    best = json.loads((out / "best.json").read_text())
    assert best["error"] == min(r["error"] for r in rows if r["status"] == "ok")
    assert any(o.startswith("ab.warmup_steps=") for o in best["overrides"])

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    exp = client.get_experiment_by_name("abtrain")
    parents = client.search_runs([exp.experiment_id], "tags.mlflow.parentRunId = ''") or [
        r
        for r in client.search_runs([exp.experiment_id])
        if "mlflow.parentRunId" not in r.data.tags
    ]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    children = [
        r
        for r in client.search_runs([exp.experiment_id])
        if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id
    ]
    assert not [c for c in children if c.info.status == "RUNNING"]  # stale ones: KILLED
    done = [c for c in children if c.info.status in ("FINISHED", "FAILED")]
    assert len(done) == len(rows) + (
        len(children) - len(done) - sum(1 for c in children if c.info.status == "KILLED")
    )
    assert {"pruned", "status"} <= set(done[0].data.tags)
    key = "island" if backend == "propulate" else "trial"
    assert all(key in c.data.tags and "worker" in c.data.tags for c in children)
    assert client.get_metric_history(done[0].info.run_id, "val_error")
    assert set(done[0].data.params) == set(space.load(_search_raw()).space)


def _search_raw():
    import yaml

    return yaml.safe_load((ROOT / "params.yaml").read_text())["search"]


def write_params(tmp_path, change):
    import yaml

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    change(params["search"])
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(params))
    return str(tmp_path / "p.yaml")


@pytest.mark.parametrize(
    "change,message",
    [
        (
            lambda s: s["space"]["optim.lr"].update(low=0.1),
            r"search\.space\.optim\.lr: Value error, low \(0\.1\) must be below high",
        ),
        (
            lambda s: s["space"]["ab.sync_mode"].update(values=[]),
            r"search\.space\.ab\.sync_mode\.values",
        ),
        (
            lambda s: s["space"].update({"optim.learning_rate": s["space"]["optim.lr"]}),
            r"search\.space\.optim\.learning_rate: not a key of the training config",
        ),
        (
            lambda s: s["space"]["ab.sigma_cutoff"].update(high=1.5),
            r"search\.space\.ab\.sigma_cutoff: value 1\.5 is invalid",
        ),
        (lambda s: s.update(ranks_per_worker=3), r"search\.ranks_per_worker=3 does not divide"),
    ],
)
def test_bad_space_fails_naming_the_key_before_any_rank_trains(tmp_path, capsys, change, message):
    params = write_params(tmp_path, change)
    assert main(["--config", params, "--out", str(tmp_path / "s")]) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "s").exists()


def test_space_encodings_round_trip():
    s = space.load(_search_raw()).space
    limits = space.propulate_limits(s)
    assert all(
        isinstance(v, tuple) and len(v) == 2 and v[0] < v[1] or v == (0, 0) for v in limits.values()
    )
    lo = {name: bounds[0] for name, bounds in limits.items()}
    hp = space.from_propulate(lo, s)
    assert hp["optim.lr"] == pytest.approx(s["optim.lr"].low)  # searched as log10
    assert hp["ab.sync_mode"] == "with_stale"  # choices travel as indices
    sets = space.overrides(hp, s, steps=200)
    assert "ab.warmup_steps=20" in sets  # a fraction of the steps
