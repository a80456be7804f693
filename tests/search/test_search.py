"""The search for real: `python -m search.launch mpirun -n 4 python -m mpi4py -m search`,
killed and resumed."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from search import record, space
from search.driver import main
from search.launch import mpirun_command
from tests.helpers import PARAMS, ROOT

TINY_SEARCH_TRAIN = [
    "method=ab",
    "steps=24",
    "eval_every=8",
    "checkpoint_every=0",
    "ab.warmup_steps=4",
    "model={name: mlp, width: 64, depth: 3, init: default}",
    "data={name: synthetic, features: 64, classes: 10, train_samples: 2000, val_samples: 400}",
]
TINY_TRAIN = "search.train=[{}]".format(
    ", ".join(f'"{t}"' if "{" in t else t for t in TINY_SEARCH_TRAIN)
)


def search_cmd(out: Path, db: Path, backend: str, evaluations: int, *extra: str, n: int = 4):
    """The search as the stage, a study and a SLURM job run it: its mpirun under
    `search.launch`."""
    return [sys.executable, "-m", "search.launch"] + mpirun_command(
        n,
        [
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
        ],
    )


def run(cmd, timeout=300, env=os.environ):
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def kill_after(cmd, out: Path, rows: int, timeout=240, also: Path | None = None, env=os.environ):
    """Start the search, and SIGKILL the whole job once `rows` evaluations (and `also`) are
    on disk."""
    said = out.parent / f"{out.name}-killed.log"  # what it printed, for a failure's message
    with open(said, "wb") as log:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + timeout
    try:
        while len(record.evaluations(out)) < rows or also and not also.exists():
            tail = said.read_text(errors="replace")[-3000:]
            assert proc.poll() is None, f"the search ended ({proc.returncode}) first:\n{tail}"
            assert time.monotonic() < deadline, f"no evaluations in time:\n{tail}"
            time.sleep(0.5)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:  # it had ended: the assertion above says how
            pass
        proc.wait()


DONE_LINE = re.compile(
    r"\[search w([01])\] evaluation (\d+) of (\d+) \((\S+)\): (ok|pruned|crashed|diverged), "
    r"error [\d.]+% \((best [\d.]+%|no finished run yet)\) after \d validation\(s\) in .+; "
    r"elapsed .+, ETA (\d+ s|\d+m\d\ds|\d+h\d\dm|\?)$"
)


def assert_progress_lines(stdout: str, total: int, reached: int | None = None) -> None:
    """mpirun merges 4 ranks' output: every line arrives whole and names its worker (and
    rank); each finished evaluation says which of how many, the best so far and the ETA.
    `reached`: the last evaluation's number (`total` unless a torn row was cut off)."""
    lines = stdout.splitlines()
    assert lines and all(re.match(r"\[search w[01]( r\d)?\] ", x) for x in lines), lines
    done = [DONE_LINE.match(x) for x in lines if " evaluation " in x]
    assert done and all(done), lines
    assert {m.group(1) for m in done} == {"0", "1"}  # both workers reported
    assert {int(m.group(3)) for m in done} == {total}  # 2 workers divide Propulate's budget
    assert max(int(m.group(2)) for m in done) >= (total if reached is None else reached)
    assert any(
        re.match(rf"\[search w\d\] \S+ started \(\d+ of {total} evaluations", x) for x in lines
    )


def every_pid_left_behind_by(session: Path, tmp: Path) -> None:
    """Open MPI's session folder `session` (`ompi.<pid>`, its rendezvous files named after
    that pid) copied into `tmp` under the name of every pid the kernel can give."""
    pid = session.name.split(".")[1]
    files = [f for f in session.iterdir() if f.is_file()]
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    last = int(Path("/proc/loadavg").read_text().split("/")[-1].split()[1])
    for other in ((last + i) % pid_max for i in range(min(pid_max, 1 << 16))):
        copy = tmp / f"ompi.{other}"
        if copy == session:
            continue
        copy.mkdir()
        for f in files:
            os.link(f, copy / f.name.replace(pid, str(other)))


@pytest.mark.multiprocess
@pytest.mark.parametrize("backend", ["propulate", "optuna"])
def test_search_is_killed_resumed_and_leaves_best_config_and_mlflow_runs(tmp_path, backend):
    """A search killed with SIGKILL (its last row torn, as a crash can leave it), refused
    without --resume or on another rank count, resumed to its budget; its record, its best
    and its MLflow runs."""
    out, db = tmp_path / "search", tmp_path / "mlflow.db"
    budget = 8
    cmd = search_cmd(out, db, backend, budget)
    # Propulate dumps after the evaluation of one worker per generation, not always the
    # first to finish: wait for it, or the kill can come before any checkpoint.
    ckpt = out / "checkpoints" / "island_0_ckpt.pickle"
    kill_after(cmd, out, rows=2, also=ckpt if backend == "propulate" else None)
    killed = len(record.evaluations(out))
    assert 2 <= killed < budget and not (out / "best.json").exists()
    if backend == "propulate":
        assert ckpt.exists()
    else:
        assert (out / "optuna.journal").exists()
    # and the crash tore the last row: half of it reached the disk
    path = out / "evaluations.jsonl"
    data = path.read_bytes()
    whole = data.splitlines(keepends=True)
    kept, last = whole[:-1], whole[-1]
    os.truncate(path, len(data) - len(last) // 2)
    assert [r["id"] for r in record.evaluations(out)] == [json.loads(k)["id"] for k in kept]

    again = run(cmd)  # without --resume: refused, nothing touched
    assert again.returncode != 0 and "pass --resume" in again.stderr
    other = run(search_cmd(out, db, backend, budget, "--resume", n=2))
    assert other.returncode != 0 and "world_size" in other.stderr  # another rank count

    resumed = run(cmd + ["--resume"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # the torn row's evaluation is not made again where the backend holds it done (Optuna's
    # journal): the record then ends one short of the budget
    assert_progress_lines(resumed.stdout, budget, reached=budget - 1)
    # the torn row cut off, every finished row kept byte for byte
    assert f"{path}:{len(whole)}: cut off a torn last line" in resumed.stderr
    after = path.read_bytes()
    lines = after.splitlines(keepends=True)
    assert lines[: len(kept)] == kept and after.endswith(b"\n") and last not in lines
    rows = record.evaluations(out)
    assert len(rows) >= budget - 1 and len(rows) <= budget + 2  # budget, plus at most a re-run
    assert all(r["status"] in record.STATUSES for r in rows)
    best = json.loads((out / "best.json").read_text())
    assert best["error"] == min(r["error"] for r in rows if r["status"] == "ok")
    assert any(o.startswith("ab.warmup_steps=") for o in best["overrides"])

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    exp = client.get_experiment_by_name("abtrain-search")
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
    # One ended child per line, a re-run individual included; a kill can fall between a
    # row and the end of its child, and the torn row's child had ended before it was cut.
    lines = (out / "evaluations.jsonl").read_text().splitlines()
    assert len(lines) - 1 <= len(done) <= len(lines) + 1
    assert {"pruned", "status"} <= set(done[0].data.tags)
    key = "island" if backend == "propulate" else "trial"
    assert all(key in c.data.tags and "worker" in c.data.tags for c in children)
    assert client.get_metric_history(done[0].info.run_id, "val_error")
    assert set(done[0].data.params) == set(space.load(_search_raw()).space)
    # the parent names the best child, its values and its error
    t = parents[0].data.tags
    best_run = client.get_run(t["best.run_id"])
    assert best_run.info.run_name == best["id"] == t["best.id"]
    assert best_run.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
    assert {k: t[f"best.{k}"] for k in best["params"]} == {
        k: str(v) for k, v in best["params"].items()
    }
    assert parents[0].data.metrics["best_error"] == best["error"]
    assert f"runs/{t['best.run_id']})" in t["mlflow.note.content"]


def test_the_parent_run_names_its_best_child_with_its_values_and_a_link(tmp_path):
    """The MLflow side of a search's end, on a real SQLite store: three children (one of
    them evaluated again after a resume, as Propulate can), then the best."""
    from search.objective import Outcome

    out = tmp_path / "search"
    out.mkdir()
    runs = record.SearchRuns(f"sqlite:///{tmp_path / 'mlflow.db'}", "abtrain", True)
    parent = runs.parent("search-optuna", {"backend": "optuna"}, None)
    ids = {}
    for tag, error, lr in (("t0", 61.5, 0.01), ("t1", 48.25, 0.003), ("t1", 48.0, 0.003)):
        hp = {"optim.lr": lr, "ab.warmup_steps": 12}
        ids.setdefault(tag, []).append(runs.child(parent, tag, {"trial": tag[1]}, hp))
        outcome = Outcome(error=error, status="ok", errors=[70.0, error])
        record.append_evaluation(
            out,
            dict(
                backend="optuna",
                id=tag,
                params=hp,
                overrides=[f"optim.lr={lr}"],
                error=error,
                status="ok",
                errors=outcome.errors,
            ),
        )
        runs.finish_child(ids[tag][-1], outcome)
    best = record.write_best(out)
    runs.finish_parent(parent, best)

    run = runs.client.get_run(parent)
    t = run.data.tags
    assert best["id"] == t["best.id"] == "t1" and best["error"] == 48.0
    assert t["best.run_id"] == ids["t1"][-1]  # the latest of the two
    assert (t["best.optim.lr"], t["best.ab.warmup_steps"]) == ("0.003", "12")
    assert t["best.overrides"] == "optim.lr=0.003"
    assert run.data.metrics["best_error"] == 48.0
    link = f"#/experiments/{run.info.experiment_id}/runs/{ids['t1'][-1]}"
    assert link in t["mlflow.note.content"] and "48.00%" in t["mlflow.note.content"]
    assert run.info.status == "FINISHED"


@pytest.mark.multiprocess
def test_a_checkpoint_without_one_workers_individuals_resumes_to_its_budget(tmp_path):
    """Killed after Propulate's first dump but before the dumping worker had received the
    other worker's results: the checkpoint holds one worker's individuals only, as such a
    kill leaves it. Propulate alone fails that worker on max() of an empty sequence (and the
    other waits for it); the search gives it a stand-in and runs to its budget.
    The kill also leaves mpirun's session files (`$TMPDIR/ompi.<pid>`): the resumed
    search's mpirun, given that pid by the kernel, must not trip on them (it did: exit 213,
    "The PMIx server's listener thread failed to start"); here every pid is a killed one's."""
    import pickle

    out, db = tmp_path / "search", tmp_path / "mlflow.db"
    budget = 6
    cmd = search_cmd(out, db, "propulate", budget, "--set", "train.tracking.enabled=false")
    ckpt = out / "checkpoints" / "island_0_ckpt.pickle"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    kill_after(cmd, out, rows=1, also=ckpt, env=env)
    (left,) = tmp.glob("search-mpirun-*/ompi.*")
    every_pid_left_behind_by(left, tmp)
    population = pickle.loads(ckpt.read_bytes())
    kept = population[0].rank
    ckpt.write_bytes(pickle.dumps([ind for ind in population if ind.rank == kept]))

    resumed = run(cmd + ["--resume"], env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"no individual of island 0's worker(s) {1 - kept} yet" in resumed.stdout
    rows = record.evaluations(out)
    assert len(rows) >= budget
    best = json.loads((out / "best.json").read_text())
    assert best["error"] == min(r["error"] for r in rows if r["status"] == "ok")


@pytest.mark.pipeline  # the search stage, as dvc runs it: mpirun on this machine
@pytest.mark.multiprocess
def test_the_stage_keeps_a_search_it_cannot_resume_and_moves_aside_one_with_other_settings(
    tmp_path, monkeypatch, capfd
):
    import yaml

    from pipeline import search as stage

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["experiments"]["launcher"] = "local"
    params["search"].update(evaluations=2, train=TINY_SEARCH_TRAIN)
    params["train"]["tracking"]["enabled"] = False
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT", "1")
    monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    out = tmp_path / "runs" / "search" / "optuna"
    path = out / "evaluations.jsonl"
    assert stage.main("optuna") == 0

    # A kill before the end, and a block of the first row lost to the disk (zeros): only
    # the last line can be torn by a crash, so the resume must refuse, not guess.
    (out / "best.json").unlink()
    data = bytearray(path.read_bytes())
    assert data.count(b"\n") == 2
    data[10:30] = bytes(20)
    path.write_bytes(bytes(data))
    capfd.readouterr()
    assert stage.main("optuna") != 0
    err = capfd.readouterr().err
    assert f"{path.resolve()}:1: not a whole evaluation" in err
    assert f"could not resume the search in {out.resolve()} " in err
    assert path.read_bytes() == bytes(data) and (out / "search.json").exists()

    params["search"]["seed"] = 1  # other settings: the stage reruns, and keeps the old search
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    assert stage.main("optuna") == 0
    moved = list(out.parent.glob("optuna.moved-*"))
    assert len(moved) == 1 and (moved[0] / "evaluations.jsonl").read_bytes() == bytes(data)
    assert "search.seed" in capfd.readouterr().out
    assert len(record.evaluations(out)) == 2 and (out / "best.json").exists()


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
        (lambda s: s.update(nodes=3), r"search\.nodes=3 does not divide ranks_per_worker=2"),
        (lambda s: s.update(byte_budget=1e6), r"search\.byte_budget is a budget of objective"),
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


def test_the_backends_colours_are_no_methods():
    from pipeline.style import COLOURS
    from search.compare import BACKEND_STYLE

    used = {c.lower() for c in COLOURS.values()}
    assert {s["color"].lower() for s in BACKEND_STYLE.values()}.isdisjoint(used)
    assert len({s["color"] for s in BACKEND_STYLE.values()}) == len(BACKEND_STYLE)


def test_propulates_tradeoff_number_is_the_error_within_the_budget_and_grows_over_it():
    from search.context import tradeoff_loss
    from search.objective import Outcome

    def run(errors, sent):
        return Outcome(errors[-1], "ok", errors, inter_node_bytes=sent)

    assert tradeoff_loss(run([60.0, 50.0, 55.0], 100.0), 200.0) == 50.0  # the best, not last
    assert tradeoff_loss(run([60.0, 50.0], 300.0), 200.0) == 50.0 + 150.0
    assert tradeoff_loss(run([60.0, 50.0], 300.0), None) == 50.0
    # a point over the budget never beats one within it, however accurate
    assert tradeoff_loss(run([0.0], 201.0), 200.0) > tradeoff_loss(run([99.0], 200.0), 200.0)
    failed = Outcome(100.0, "crashed", [], "boom")
    assert tradeoff_loss(failed, 200.0) == 100.0


@pytest.mark.multiprocess
def test_a_search_stopped_by_sigterm_says_so_last_and_how_to_go_on(tmp_path):
    """SIGTERM to the process that runs the search under mpirun (the search stage, a
    study), as `kill` or a scheduler's end of job sends it, once an evaluation is on disk:
    the last line says that the search stopped, after how many evaluations, and how to go on
    (mpirun drops what its ranks say as it stops)."""
    out = tmp_path / "s"
    args = search_cmd(out, tmp_path / "m.db", "propulate", 8, n=2)
    args = args[args.index("search") + 1 :]  # what follows `python -m mpi4py -m search`
    code = f"import sys; from search.launch import run_mpirun; sys.exit(run_mpirun(2, {args!r}))"
    errors = (tmp_path / "stderr").open("w+")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(tmp)},
        stdout=subprocess.DEVNULL,
        stderr=errors,
    )
    try:
        deadline = time.monotonic() + 240
        while len(record.evaluations(out)) < 1:
            assert proc.poll() is None and time.monotonic() < deadline, "no evaluation in time"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    errors.seek(0)
    lines = [line for line in errors.read().splitlines() if line.strip()]
    done = len(record.evaluations(out))
    assert lines[-1] == (
        f"[search] stopped by SIGTERM after {done} evaluations, kept in {out}: the same "
        "command continues it"
    ), lines[-3:]
    assert not list(tmp.iterdir())  # mpirun's session files went with it


def test_optuna_hands_the_trials_after_its_random_start_to_tpe():
    """The sampler the Optuna backend makes: its first `search.startup_trials` trials are
    the draws of a random sampler of the same seed, and every later one is TPE's own (with
    Optuna's default start of 10, a search of 8 trials was random from end to end)."""
    import optuna

    from search.optuna_backend import sampler

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    s = space.load(yaml.safe_load(PARAMS.read_text())["search"], ["startup_trials=2"])

    def objective(trial):
        hp = space.suggest(trial, s.space)
        return abs(hp["optim.lr"] - 0.001) * 1000 + hp["ab.sigma_cutoff"]

    studies = []
    for made in (sampler(s, 0), optuna.samplers.RandomSampler(seed=s.seed * 1009)):
        studies.append(optuna.create_study(sampler=made))
        studies[-1].optimize(objective, n_trials=8)
    same = [a.params == b.params for a, b in zip(*(st.trials for st in studies))]
    assert same == [True, True] + [False] * 6
