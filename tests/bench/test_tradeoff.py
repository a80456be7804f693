"""The trade-off study (bench.tradeoff) in miniature, for real: both backends' searches
under mpirun on the synthetic task, seeds on the front, points.json, the fronts, the figure,
the verdict and MLflow's parent run; a second study of its folder refused, the study killed
outright (kill -9) inside its second search, its mpirun gone with it, and continued. The
study itself (about 45 minutes) is not run here."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import yaml

from abtrain.config import apply_overrides, read_yaml
from bench.tradeoff.page import verdict
from tests.helpers import PARAMS, ROOT, TINY, processes


def miniature(tmp_path):
    p = read_yaml(PARAMS)
    mlflow = [f"tracking.uri=sqlite:///{tmp_path}/m.db", "tracking.enabled=true"]
    p["train"] = apply_overrides(p["train"], [*TINY, *mlflow])
    t = p["tradeoff"]
    # a random start of 2 trials (a third of 6) and of 4 individuals (2 workers: Propulate
    # breeds from its 5th), 2 generations a worker past it; each method's best front point
    # again at one other seed, and at twice the steps (which front points a method trains
    # again when it has several: the test after the verdict's)
    t.update(
        methods=["ddp", "ab"],
        budgets=[0.9],
        seeds=1,
        front_points=1,
        long_steps=48,
        startup=2,
        evaluations={"optuna": {"ddp": 2, "ab": 6}, "propulate": {"ab": 8}},
        train=["steps=24", "eval_every=8", "checkpoint_every=0"],
    )
    t["spaces"] = {m: t["spaces"][m] for m in t["methods"]}
    t["spaces"]["ab"]["model.init"]["values"] = ["default"]  # the MLP has no ortho-σ
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))
    return p


def session(sid: int) -> dict[int, str]:
    """The processes of session `sid` (the study and all it started): pid -> command line."""
    return {pid: p.command for pid, p in processes().items() if p.session == sid}


def front_of(points):
    """The test's own Pareto rule: no point of the method as accurate for fewer bytes."""
    out = []
    for p in points:
        mine = [q for q in points if q["method"] == p["method"] and q is not p]
        out.append(
            not any(
                q["best_top1"] >= p["best_top1"]
                and q["inter_node_bytes_per_rank"] <= p["inter_node_bytes_per_rank"]
                and (
                    q["best_top1"] > p["best_top1"]
                    or q["inter_node_bytes_per_rank"] < p["inter_node_bytes_per_rank"]
                )
                for q in mine
            )
        )
    return out


@pytest.mark.multiprocess
def test_the_study_searches_both_backends_resumes_and_reports_fronts_from_its_files(tmp_path):
    miniature(tmp_path)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    }
    cmd = [sys.executable, "-m", "bench.tradeoff"]
    first = subprocess.Popen(
        cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    said = []
    for line in first.stdout:
        said.append(line)
        if line.startswith("[bench.tradeoff] run 2 of"):  # DDP's search finished, AB's next
            break
    assert "the rest about" in said[0] and "ETA" in said[1]
    ddp_rows = tmp_path / "runs/tradeoff/ddp/optuna/evaluations.jsonl"
    before = ddp_rows.stat().st_mtime_ns
    # a second study of the same folder, while the first searches: refused, nothing touched
    while not any("mpirun" in c or "prterun" in c for c in session(first.pid).values()):
        assert first.poll() is None, "the study ended before its second search started"
        time.sleep(0.1)
    second = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert second.returncode == 2, second.stdout[-2000:] + second.stderr[-2000:]
    assert second.stderr.count("\n") == 1 and "in use by another bench.tradeoff" in second.stderr
    assert "nothing started" in second.stderr
    # the study killed outright, alone (not its group): its mpirun and ranks go within seconds
    searching = {p: c for p, c in session(first.pid).items() if "mpirun" in c or "prterun" in c}
    assert searching, "the search had ended before the study was killed"
    os.kill(first.pid, signal.SIGKILL)
    first.wait(timeout=30)
    deadline = time.monotonic() + 5  # left alone, they searched on for 5 s and more
    while (left := session(first.pid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"still running after the study was killed: {left}"
    again = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "run 1 of 7: finished, read from runs/tradeoff/ddp/optuna" in again.stdout
    assert ddp_rows.stat().st_mtime_ns == before  # the finished search was not run again

    out = tmp_path / "reports/tradeoff"
    data = json.loads((out / "points.json").read_text())
    points = data["points"]
    for p in points:  # the record's schema
        assert {"method", "backend", "params", "seeds", "best_top1"} <= set(p)
        assert {
            "inter_node_bytes_per_rank",
            "bytes_vs_ddp",
            "compression",
            "kept_rank",
            "steps",
            "front",
        } <= set(p)
        assert p["steps"] == 24 and p["inter_node_bytes_per_rank"] > 0
    assert {p["backend"] for p in points if p["method"] == "ab"} == {"optuna", "propulate"}
    assert len([p for p in points if p["method"] == "ab"]) >= 10  # 6 + 8, minus repeats
    ddp = [p for p in points if p["method"] == "ddp"]
    assert all(p["bytes_vs_ddp"] == pytest.approx(1.0) for p in ddp)
    assert [p["front"] for p in points] == front_of(points)
    # the front points trained again at a seed not the search's, their figure that seed's
    seeded = [p for p in points if len(p["seeds"]) == 2]
    assert seeded and all(p["rerun_seeds"] == 1 for p in seeded)
    assert all(p["best_top1"] == p["top1"][1] for p in seeded)
    assert {p["method"] for p in seeded} == {"ddp", "ab"}
    assert all(len(p.get("long_top1", [])) == 1 for p in points if p.get("long_at"))
    assert {p["method"] for p in points if p.get("long_at")} == {"ddp", "ab"}
    searched_by_tpe(tmp_path / "runs/tradeoff/ab/optuna", workers=2, trials=6, startup=2)
    bred_by_propulate(tmp_path / "runs/tradeoff/ab/propulate-b0.9", workers=2)
    progress = {(x["method"], x["backend"]): x for x in data["searches"]}
    assert progress["ab", "optuna"]["random_start"] == 2
    assert progress["ab", "propulate"]["random_start"] == 4
    assert all(len(x["hypervolume"]) == x["evaluations"] for x in data["searches"])
    # the verdict names, at each budget, the best point within it, from the files alone
    assert data["verdict"] == verdict(data)
    for b in data["budgets"]:
        inside = [p for p in points if p["bytes_vs_ddp"] <= b + 1e-9]
        if inside:
            assert f"at ≤ {b:.0%} of DDP's inter-node bytes the best top-1 is" in data["verdict"]
    assert data["verdict"] in again.stdout
    assert (out / "tradeoff.png").stat().st_size > 10_000
    made = {f: (out / f).read_bytes() for f in ("points.json", "README.md")}
    render = subprocess.run(
        [*cmd, "--render"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert render.returncode == 0, render.stderr[-2000:]
    assert (out / "README.md").read_bytes() == made["README.md"]
    # MLflow: the study one parent run, each point nested under it, the figure its artifact
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path}/m.db")
    exp = client.get_experiment_by_name("tradeoff")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.info.run_name == "tradeoff"]
    assert len(parents) == 1
    pid = parents[0].info.run_id
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == pid]
    assert len(children) == len(points)
    assert "tradeoff.png" in {a.path for a in client.list_artifacts(pid)}

    # on another machine: only the committed state (reports/tradeoff/state), 2 more trials
    # for AB's Optuna search: those 2 are trained, nothing else
    rows = tmp_path / "runs/tradeoff/ab/optuna/evaluations.jsonl"
    had = rows.read_bytes()
    shutil.rmtree(tmp_path / "runs")
    p = read_yaml(tmp_path / "params.yaml")
    p["tradeoff"]["evaluations"]["optuna"]["ab"] = 8
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))
    more = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert more.returncode == 0, more.stdout[-3000:] + more.stderr[-3000:]
    assert "of the committed state restored" in more.stdout
    trained = [x for x in more.stdout.splitlines() if re.search(r"run \d+ of \d+: \S", x)]
    started = [x for x in trained if ": finished, read from" not in x]
    assert len(started) == 1 and "ab: optuna" in started[0], trained
    now = rows.read_bytes()
    assert now.startswith(had) and len(now[len(had) :].splitlines()) == 2


def searched_by_tpe(folder, workers: int, trials: int, startup: int) -> None:
    """From the search's records: each worker's first trials are its random sampler's draws
    (TPE's start-up), and most of the search is not: TPE proposed them. Workers ask in
    parallel, so the start-up can run a trial per worker over its count."""
    import optuna

    from search import space

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    q = read_yaml(folder.parent / f"{folder.name}.params.yaml")["search"]
    s = space.load(q)
    rows = [json.loads(x) for x in (folder / "evaluations.jsonl").read_text().splitlines()]
    random = 0
    for w in range(workers):
        mine = sorted((r for r in rows if r["worker"] == w), key=lambda r: r["trial"])
        replay = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=s.seed * 1009 + w))
        drawn = [space.suggest(replay.ask(), s.space) for _ in mine]
        same = [r["params"] == d for r, d in zip(mine, drawn)]
        lead = same.index(False) if False in same else len(same)
        assert lead >= 1 and not any(same[lead:]), same
        random += lead
    assert startup <= random <= startup + workers - 1 and trials - random >= 3


def bred_by_propulate(folder, workers: int) -> None:
    """From the search's records: past its random start (2 individuals a worker), an
    individual shares a float gene exactly with an earlier one (crossover copies genes;
    two uniform draws never coincide)."""
    rows = [json.loads(x) for x in (folder / "evaluations.jsonl").read_text().splitlines()]
    floats = ("optim.lr", "optim.weight_decay", "ab.sigma_cutoff")
    start = [r for r in rows if int(r["id"].rsplit("-g", 1)[1]) < 2]
    assert len(start) == 2 * workers and len(rows) > len(start)
    genes = [(k, r["params"][k]) for r in start for k in floats]
    assert len(set(genes)) == len(genes)  # the random start: no gene twice
    genes = [(k, r["params"][k]) for r in rows for k in floats]
    assert len(set(genes)) < len(genes)  # bred: a gene copied from a parent


def test_the_figure_rings_in_black_only_the_points_that_compress(tmp_path, monkeypatch):
    """Black means "compresses" on the figure: the committed points drawn, the artists with
    a black edge hold exactly the points whose compression is over 1:1 (the seed diamonds'
    edges are white)."""
    import matplotlib.colors as mcolors

    from bench.tradeoff import page
    from pipeline import style

    data = json.loads((ROOT / "reports" / "tradeoff" / "points.json").read_text())
    drawn = []
    monkeypatch.setattr(style, "save", lambda fig, path, **kw: drawn.append(fig))
    page.draw(data, tmp_path / "t.png")
    (ax,) = drawn[0].axes

    def black(colour) -> bool:
        rgba = mcolors.to_rgba_array(colour)
        return len(rgba) > 0 and all(tuple(c[:3]) == (0.0, 0.0, 0.0) for c in rgba)

    ringed = set()
    for c in ax.collections:
        if len(c.get_offsets()) and black(c.get_edgecolor()):
            ringed |= {tuple(map(float, xy)) for xy in c.get_offsets()}
    want = {(p["bytes_vs_ddp"], p["best_top1"]) for p in data["points"] if p["compression"] > 1}
    assert want and ringed == want
    markers = [ln for ln in ax.lines if ln.get_marker() == "D"]
    assert markers and not any(black(ln.get_markeredgecolor()) for ln in markers)


def test_the_committed_state_holds_what_resumes_a_search_and_never_a_runs_weights(tmp_path):
    """save() copies a search's settings, rows, journal and checkpoints and a rerun's point
    and summary, not the evaluations' folders or any weights; restore() fills only what a
    runs folder lacks (its own files are newer)."""
    from bench.tradeoff import state

    runs, kept = tmp_path / "runs", tmp_path / "state"
    search = runs / "ab" / "optuna"
    small = {
        search / "search.json": "{}",
        search / "evaluations.jsonl": '{"id": "t0"}\n',
        search / "optuna.journal": "x",
        runs / "ab" / "optuna.params.yaml": "search: {}\n",
        runs / "ab" / "propulate-b0.1" / "checkpoints" / "island_0_ckpt.pickle": "p",
        runs / "seeds" / "ab-b0.1-p0-s1" / "point.json": "{}",
        runs / "seeds" / "ab-b0.1-p0-s1" / "summary.json": "{}",
    }
    large = {
        search / "individuals" / "t0" / "summary.json": "{}",
        search / "individuals" / "t0" / "model.pt": "w",
        runs / "seeds" / "ab-b0.1-p0-s1" / "model.pt": "w",
        runs / "seeds" / "ab-b0.1-p0-s1" / "checkpoints" / "step-24.pt": "w",
    }
    for path, text in {**small, **large}.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert state.save(runs, kept) == len(small) and state.save(runs, kept) == 0
    assert {kept / p.relative_to(runs) for p in small} == {
        p for p in kept.rglob("*") if p.is_file()
    }
    (search / "evaluations.jsonl").write_text('{"id": "t0"}\n{"id": "t1"}\n')  # newer here
    shutil.rmtree(runs / "seeds")
    assert state.restore(runs, kept) == 2
    assert (runs / "seeds" / "ab-b0.1-p0-s1" / "point.json").exists()
    assert (search / "evaluations.jsonl").read_text().count("\n") == 2


def _point(method, top1, share, long=None, budget=0.4):
    return dict(
        method=method, backend="optuna", budget=None, id="t0", params={"optim.lr": 0.001},
        best_top1=top1, best_top1_sd=0.5, rerun_seeds=3, bytes_vs_ddp=share, compression=1.0,
        steps=160, chosen_at=[budget], long_at=[budget] if long else [], long_top1=long or [],
        long_steps=640,
    )  # fmt: skip


def test_the_verdict_names_local_sgd_beside_ab_and_says_how_the_ranking_moves_with_length():
    """At a budget: the winner, AB's best and local SGD's best (AB's low rank against syncing
    less often); at 640 steps whether the order holds, keeps its first, or changes."""
    data = dict(
        budgets=[0.4],
        searches=[],
        points=[
            _point("powersgd", 31.0, 0.1, long=[39.0, 39.0, 39.0]),
            _point("localsgd", 30.0, 0.2, long=[38.0, 38.0, 38.0]),
            _point("ab", 29.0, 0.35, long=[38.5, 38.5, 38.5]),
        ],
    )
    said = verdict(data)
    assert "the best top-1 is 31.00 ± 0.50% (3 other seeds), powersgd" in said
    assert "AB's best 29.00 ± 0.50% (3 other seeds) at 35% of the bytes" in said
    assert "local SGD's best 30.00 ± 0.50% (3 other seeds) at 20%" in said
    assert "within ≤ 40% keeps powersgd first: powersgd 39.00%, ab 38.50%, localsgd 38.00%" in said
    data["points"][2]["long_top1"] = [37.0] * 3
    assert "within ≤ 40% holds: powersgd 39.00%, localsgd 38.00%, ab 37.00%" in verdict(data)
    data["points"][0]["long_top1"] = [36.0] * 3
    assert "within ≤ 40% changes: localsgd 38.00%" in verdict(data)


def test_the_front_points_trained_again_are_a_methods_most_accurate_within_the_budget():
    """The study trains each method's `front_points` most accurate front points within a
    budget again (the miniature above: one a method): off the front, over the budget or
    another method's point is never one of them."""
    from bench.tradeoff.fronts import candidates

    def pt(method, top1, share, front=True):
        return dict(method=method, best_top1=top1, bytes_vs_ddp=share, front=front)

    points = [
        pt("ab", 30.0, 0.2),
        pt("ab", 31.0, 0.3),
        pt("ab", 32.0, 0.5),  # over the budget
        pt("ab", 33.0, 0.1, front=False),
        pt("ab", 29.0, 0.05),
        pt("powersgd", 34.0, 0.1),
    ]
    assert [p["best_top1"] for p in candidates(points, "ab", 0.4, 2)] == [31.0, 30.0]
    assert [p["best_top1"] for p in candidates(points, "ab", 0.4, 5)] == [31.0, 30.0, 29.0]
    assert candidates(points, "diloco", 0.4, 2) == []
