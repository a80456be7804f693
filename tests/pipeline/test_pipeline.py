"""`dvc repro` for real on a miniature pipeline, in a temporary copy of the repository."""

import difflib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image
from ruamel.yaml import YAML

from pipeline.miniature.run import freeze_paper_scale
from tests.helpers import ROOT, Proc, processes

# dvc on a copy of the repository, every test; the `mini` pipeline trains with torchrun and
# searches with mpirun
pytestmark = pytest.mark.pipeline

BIN = Path(sys.executable).parent
README = ROOT / "README.md"
TINY_VIT = {
    "name": "python",
    "factory": "timm.models.vision_transformer:VisionTransformer",
    "kwargs": {
        "img_size": 16,
        "patch_size": 4,
        "embed_dim": 32,
        "depth": 2,
        "num_heads": 2,
        "mlp_ratio": 2.0,
        "qkv_bias": False,
        "drop_path_rate": 0.0,
    },
    "init": "ortho_sigma",
}


RUN_NAMES = {"ddp-2x1", "ab-2x1", "ab-2x1-global"}


def copy_repo(dest: Path) -> None:
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for f in files:
        if (ROOT / f).is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, dest / f)
    for cmd in (
        ["git", "init", "-q"],
        ["git", "add", "-A"],
        ["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "copy"],
    ):
        subprocess.run(cmd, cwd=dest, check=True)


def write_images(root: Path) -> None:
    rng = np.random.default_rng(0)
    for split, n in (("train", 24), ("val", 8)):
        for c, cls in enumerate(("dark", "light")):
            (root / split / cls).mkdir(parents=True)
            for i in range(n):  # learnable: dark and light images
                base = 60 + 130 * c
                px = np.clip(rng.normal(base, 40, (16, 16, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(px).save(root / split / cls / f"{i}.png")


def miniature(params: dict, images: Path) -> dict:
    t = params["train"]
    t["model"] = TINY_VIT
    t["data"].update(
        name="imagefolder",
        source=str(images),
        sha256=None,
        prepared="data/prepared/mini",
        train_per_class=0,
        val_per_class=0,
        real_labels=None,
        image_size=16,
        workers=1,
    )
    t["batch_size"] = 4
    s = params["search"]
    s.update(ranks=2, ranks_per_worker=2, evaluations=2, startup_trials=1)
    s["train"] = ["method=ab", "steps=12", "eval_every=4", "checkpoint_every=0"]
    params["experiments"].update(epochs=1, evaluations=2, reference_global_batch=8)
    params["experiments"]["runs"] = {
        "ddp-2x1": {"method": "ddp", "nodes": 2, "ranks_per_node": 1, "batch": "local"},
        "ab-2x1": {"method": "ab", "nodes": 2, "ranks_per_node": 1, "batch": "local"},
        "ab-2x1-global": {"method": "ab", "nodes": 2, "ranks_per_node": 1, "batch": "global"},
    }
    return params


def dvc_env() -> dict[str, str]:
    """The environment DVC and what it runs see: this venv's programs first, and no $SHELL, as
    in CI or a batch job (DVC then runs each stage under /bin/sh, which may stay as the
    stage's parent: dash does)."""
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1"}
    env.pop("SHELL", None)
    return env


def dvc(repo: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = dvc_env()
    return subprocess.run(
        [str(BIN / "dvc"), *args],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pipeline")
    repo = tmp / "repo"
    copy_repo(repo)
    write_images(tmp / "images")
    # edited as a user edits it (its layout and comments kept): `-S` is tested on that text
    rt = YAML()
    params = miniature(rt.load((repo / "params.yaml").read_text()), tmp / "images")
    with (repo / "params.yaml").open("w") as f:
        rt.dump(params, f)
    freeze_paper_scale(repo)  # paper-scale predictions, not the miniature's: as pipeline.miniature
    first = dvc(repo, "repro")
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    return repo, first


@pytest.mark.multiprocess
def test_repro_runs_every_stage_to_a_report_with_measured_numbers(mini):
    repo, first = mini
    for name in ("ddp-2x1", "ab-2x1", "ab-2x1-global"):
        s = json.loads((repo / "results" / f"{name}.json").read_text())
        assert s["steps"] > 0 and s["traffic"]["inter_node_bytes"] > 0
        assert s["run"]["name"] == name and s["run"]["model"] == "VisionTransformer"
        assert (repo / "runs" / "train" / name / "train_log.csv").exists()
        # `dvc metrics show`: a few scalars per run, not the summary
        scalars = json.loads((repo / "metrics" / f"{name}.json").read_text())
        assert set(scalars) == {
            "top1_best",
            "top1_final",
            "inter_node_mb_per_step",
            "compression",
            "wall_minutes",
        }
        assert scalars["inter_node_mb_per_step"] == pytest.approx(
            s["traffic"]["inter_node_bytes"] / s["steps"] / 1e6, rel=1e-3
        )
        curve = json.loads((repo / "plots" / f"{name}.json").read_text())
        assert [r["step"] for r in curve] == [e["step"] for e in s["evals"]]
        assert curve[-1]["run"] == name and curve[-1]["samples"] > 0
        assert curve[-1]["inter_node_mb"] >= curve[0]["inter_node_mb"] > 0
    best = json.loads((repo / RECORD[0]).read_text())
    assert best["evaluations"] == 2
    cfg = json.loads((repo / "runs/train/ab-2x1/config.json").read_text())
    assert cfg["optim"]["lr"] == pytest.approx(best["params"]["optim.lr"])  # use_best
    assert "optim.lr=" in first.stdout and "<- search best (propulate)" in first.stdout
    report = (repo / "reports" / "README.md").read_text()
    traffic = report[report.index("## Traffic") :]
    ab = next(line for line in traffic.splitlines() if line.startswith("| ab-2x1 | ab |"))
    assert "—" not in ab.split("|")[6]  # a measured MB/step, not a gap
    for png in (
        "traffic_vs_scale.png",
        "accuracy_compression_vs_ranks.png",
        "val_top1_vs_step.png",
        "val_top1_vs_inter_node_mb.png",
        "search_comparison.png",
    ):
        assert (repo / "reports" / "figures" / png).stat().st_size > 1000
        assert f"(figures/{png})" in report  # shown on the page, with its caption
    rows = list((repo / "reports" / "table1_traffic.csv").read_text().splitlines())
    assert len(rows) == 4  # header + 3 runs
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{repo / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("abtrain").experiment_id])
    names = {r.info.run_name for r in runs}
    assert not {n for n in names if n.startswith("search-")}  # the searches have their own
    searches = client.get_experiment_by_name("abtrain-search").experiment_id
    parents = [r for r in client.search_runs([searches]) if r.info.run_name.startswith("search-")]
    assert {r.info.run_name for r in parents} == {"search-propulate", "search-optuna"}
    assert {r.data.params["ranks"] for r in parents} == {"2"}  # the mpirun's, as it ran
    assert sum(1 for r in runs if r.data.tags.get("dataset") == "imagefolder") == 3  # trainings
    trained = {r.info.run_name: r.data.tags for r in runs if r.info.run_name in RUN_NAMES}
    assert set(trained) == RUN_NAMES
    assert (
        trained["ab-2x1-global"]["scale"] == "2x1" and trained["ab-2x1-global"]["batch"] == "global"
    )


@pytest.mark.multiprocess
def test_second_repro_does_nothing(mini):
    repo, _ = mini
    again = dvc(repo, "repro")
    assert again.returncode == 0
    assert "Running stage" not in again.stdout
    assert "up to date" in (again.stdout + again.stderr).lower()


def git(repo: Path, *args: str) -> str:
    who = ["-c", "user.email=t@t", "-c", "user.name=t"]
    return subprocess.run(
        ["git", *who, *args], cwd=repo, capture_output=True, text=True, check=True
    ).stdout


RECORD = ("results/search/propulate/best.json", "results/search/propulate/evaluations.jsonl")


@pytest.mark.multiprocess
def test_a_fresh_clone_retrains_one_run_then_trains_the_rest_from_the_committed_record(
    mini, tmp_path
):
    """As a new user: clone what was committed (the searches' records, dvc.lock, results).
    First the README's retrain command: one run trained afresh through DVC, then the report
    alone; no search reruns, no other run trains, and every other committed file, the other
    stages' lines of dvc.lock included, stays byte for byte. Then `dvc repro`: the searches
    don't run again (their outcome moves with timing); every other run trains, and every run
    gives back the committed figures exactly. One clone for both (each used to make its own)."""
    repo, _ = mini
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "the pipeline's outputs")
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(repo), str(clone))
    assert not (clone / "runs").exists()  # nothing of the search's workspace travels

    name = "ab-2x1"
    own = {f"{d}/{name}.json" for d in ("results", "plots", "metrics")}
    command = re.search(r"\n(\.venv/bin/python -m pipeline\.retrain [^\n]*)\n", README.read_text())
    assert command, "the README gives no retrain command"
    args = shlex.split(command[1])[1:]
    args[-1] = name  # the README's example run, as this miniature names its runs

    def committed() -> dict[str, bytes]:
        out = {}
        for top in ("results", "plots", "metrics", "bench/results"):
            for f in (clone / top).rglob("*"):
                rel = str(f.relative_to(clone))
                if f.is_file() and rel not in own:
                    out[rel] = f.read_bytes()
        lock = yaml.safe_load((clone / "dvc.lock").read_text())["stages"]
        mine = (f"train@{name}", "report")
        out["dvc.lock"] = json.dumps({k: v for k, v in lock.items() if k not in mine})
        return out

    before = committed()
    result = json.loads((clone / "results" / f"{name}.json").read_text())
    report = (clone / "reports" / "README.md").stat().st_mtime_ns
    env = dvc_env()
    run = subprocess.run(
        [sys.executable, *args], cwd=clone, env=env, capture_output=True, text=True, timeout=900
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    ran = re.findall(r"Running stage '([^']+)'", run.stdout)
    # one run trained, then the report; first the data, which a fresh clone lacks
    assert ran == ["prepare", f"train@{name}", "report"], ran
    assert committed() == before
    again = json.loads((clone / "results" / f"{name}.json").read_text())
    assert again["val_top1"] == result["val_top1"]  # the same config trains the same run
    assert again["wall_seconds"] != result["wall_seconds"]  # and it did train
    assert (clone / "reports" / "README.md").stat().st_mtime_ns > report

    rest = dvc(clone, "repro")
    assert rest.returncode == 0, rest.stdout[-4000:] + rest.stderr[-4000:]
    assert "Running stage 'search@" not in rest.stdout
    assert f"Running stage 'train@{name}'" not in rest.stdout  # trained above
    for other in RUN_NAMES - {name}:
        assert f"Running stage 'train@{other}'" in rest.stdout
    for each in RUN_NAMES:
        mine, theirs = (
            json.loads((r / "metrics" / f"{each}.json").read_text()) for r in (clone, repo)
        )
        mine.pop("wall_minutes"), theirs.pop("wall_minutes")
        assert mine == theirs, each
    for path in RECORD:
        assert (clone / path).read_bytes() == (repo / path).read_bytes()
    status = dvc(clone, "status", "--json")
    assert json.loads(status.stdout) == {}, status.stdout


def changed_by(repo: Path, edit) -> set[str]:
    """The stages `dvc status` finds changed once `edit` changed the params and the resolve
    stage (seconds, no training) wrote the runs' values again; then both undone."""
    text = (repo / "params.yaml").read_text()
    params = yaml.safe_load(text)
    edit(params)
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    try:
        assert dvc(repo, "repro", "--single-item", "resolve").returncode == 0
        status = dvc(repo, "status", "--json")
        assert status.returncode == 0, status.stderr
        return set(json.loads(status.stdout))
    finally:
        (repo / "params.yaml").write_text(text)
        assert dvc(repo, "repro", "--single-item", "resolve").returncode == 0


@pytest.mark.multiprocess
def test_settings_that_change_no_output_rerun_no_stage(mini):
    repo, _ = mini

    def watching(p):  # MLflow's view of the runs, and how long a peer may take
        t = p["train"]
        t["tracking"].update(log_every=3, experiment="other", required=False, uri="sqlite:///x.db")
        t["tracking"].update(run_name="mine", tags={"team": "x"}, enabled=False)
        t["dist"]["timeout_s"] = 77

    assert changed_by(repo, watching) == set()

    def searched(p):  # a key every run takes from the search's best: no run trains again
        p["train"]["optim"]["lr"] = 0.0042

    assert not {s for s in changed_by(repo, searched) if s.startswith(("train@", "search@"))}

    def where(p):  # where the runs execute: the same config trains the same numbers
        p["experiments"]["launcher"] = "slurm"
        p["experiments"]["slurm"].update(partition="gpu", account="me", time="01:00:00")

    # (the report stage's params are its own concern)
    assert changed_by(repo, where) - {"report"} == set()


@pytest.mark.multiprocess
def test_each_stage_reruns_for_the_keys_it_reads(mini):
    repo, _ = mini

    def one_run(p):
        p["experiments"]["runs"]["ab-2x1"]["batch"] = "global"

    assert changed_by(repo, one_run) == {"prepare", "train@ab-2x1", "report"}

    def experiment_value(p):
        p["experiments"]["set"] = ["optim.lr=0.001"]

    changed = changed_by(repo, experiment_value)
    assert {f"train@{n}" for n in RUN_NAMES} <= changed
    assert not {"search@propulate", "search@optuna"} & changed  # the searches don't see it

    def search_input(p):
        p["train"]["optim"]["label_smoothing"] = 0.05

    assert {"search@propulate", "search@optuna", "train@ab-2x1"} <= changed_by(repo, search_input)


@pytest.mark.multiprocess
def test_changing_the_search_space_reruns_the_search_and_what_follows(mini):
    repo, _ = mini

    def space(p):
        p["search"]["space"]["ab.sigma_cutoff"]["high"] = 0.3

    changed = changed_by(repo, space)
    assert {"search@propulate", "search@optuna"} <= changed
    assert "prepare" not in changed
    # the runs follow the search through its best (resolve), the report follows them
    dag = dvc(repo, "dag", "--dot").stdout
    edges = set(re.findall(r'"([^"]+)" -> "([^"]+)"', dag))
    assert {
        ("search@optuna", "report"),
        ("search@propulate", "resolve"),
        ("resolve", "train@ab-2x1"),
        ("train@ab-2x1", "report"),
    } <= edges


@pytest.mark.multiprocess
def test_missing_runs_leave_a_gap_not_a_crash(mini, tmp_path):
    repo, _ = mini
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}

    def report() -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "pipeline.report"],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    (repo / "results" / "ab-2x1-global.json").rename(tmp_path / "kept.json")
    try:
        proc = report()
        assert proc.returncode == 0, proc.stderr
        md = (repo / "reports" / "README.md").read_text()
        assert "| ab-2x1-global | — |" in md and "missing from this report: ab-2x1-global" in md
    finally:  # the module's pipeline as it was, for the tests after this one
        (tmp_path / "kept.json").rename(repo / "results" / "ab-2x1-global.json")
        assert report().returncode == 0


@pytest.mark.multiprocess
def test_offline_dvc_plots_hold_every_run_without_a_network(mini):
    repo, _ = mini
    for chart in ("val_top1_vs_step", "val_top1_vs_inter_node_mb"):
        html = (repo / "reports" / "plots" / f"{chart}.html").read_text()
        assert "cdn.jsdelivr" not in html and 'src="http' not in html  # scripts inline
        for name in RUN_NAMES:  # the page carries every run's data
            assert f'"run":"{name}"' in html.replace(" ", ""), (chart, name)
        svg = (repo / "reports" / "figures" / f"{chart}.svg").read_text()
        assert "local batch" in svg and "global batch" in svg  # a panel per batch scheme


def test_the_paper_profile_validates_and_every_stage_resolves(tmp_path, monkeypatch):
    from pipeline import matrix, slurm
    from search import space

    paper = yaml.safe_load((ROOT / "profiles" / "paper.yaml").read_text())
    monkeypatch.setattr(
        matrix, "train_size", lambda cfg: {"imagenet": 1_281_167, "cifar10": 50_000}[cfg.data.name]
    )
    runs = matrix.runs(paper)
    assert len(runs) == 60  # 58 cells of the matrix, and the second 2-node ResNet-50 weight decay
    for run in runs.values():
        sets = matrix.run_overrides(paper, run, None)
        assert any(s.startswith("steps=") for s in sets)
        script = slurm.train_script(
            paper["experiments"]["slurm"],
            run.nodes,
            run.ranks_per_node,
            ["train", "--out", "x"],
            tmp_path,
            run.name,
        )
        assert f"--nodes={run.nodes}" in script and "--gres=gpu:4" in script
    vit = matrix.run_overrides(paper, runs["vit-ab-2n-local"], None)
    assert "steps=90000" in vit and "batch_size=256" in vit  # the authors' 2-node run length
    assert "batch_size=128" in matrix.run_overrides(paper, runs["vit-ab-8n-global"], None)
    assert "batch_size=32" in matrix.run_overrides(paper, runs["vit-ab-32n-global"], None)
    s = space.load(paper["search"])
    space.check_keys(s.space, paper["train"])
    # the search's CIFAR-100 too: nothing else prepares it, and unprepared, every one of the
    # search's runs would crash into the penalty
    assert {d.name for d in matrix.data_configs(paper)} == {"imagenet", "cifar10", "cifar100"}
    repo = tmp_path / "repo"
    copy_repo(repo)
    shutil.copy(ROOT / "profiles" / "paper.yaml", repo / "params.yaml")
    listed = dvc(repo, "stage", "list")
    assert listed.returncode == 0, listed.stderr
    assert "train@vgg-ab-2n" in listed.stdout and "train@r50-abng-32n-global" in listed.stdout


@pytest.mark.multiprocess
def test_compare_measures_each_run_against_its_own_ddp(mini, capsys):
    from abtrain.__main__ import main

    repo, _ = mini
    folders = sorted((repo / "runs" / "train").iterdir())
    assert main(["compare", *map(str, folders)]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[1:]}
    assert set(rows) == RUN_NAMES
    assert rows["ddp-2x1"][-1] == "1.000"
    for name in ("ab-2x1", "ab-2x1-global"):  # 4 per rank, 2 ranks: ddp-2x1's scale
        ratio = float(rows[name][-2]) / float(rows["ddp-2x1"][-2])
        assert float(rows[name][-1]) == pytest.approx(ratio, abs=2e-3)


@pytest.mark.multiprocess
def test_an_experiments_value_is_the_one_trained(mini):
    """`dvc exp run -S` as docs/pipeline.md says, for one run (the order of the sources, a search
    that reruns included, is tests/pipeline/test_overrides.py's)."""
    repo, _ = mini
    lr = 0.00123
    run = dvc(repo, "exp", "run", "-S", f'experiments.set=["optim.lr={lr}"]', "train@ab-2x1")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert "Running stage 'search@" not in run.stdout  # the searches don't read it
    assert "Running stage 'train@ab-2x1'" in run.stdout
    assert f"optim.lr={lr}  <- experiments.set; replaces" in run.stdout
    cfg = json.loads((repo / "runs" / "train" / "ab-2x1" / "config.json").read_text())
    assert cfg["optim"]["lr"] == lr


@pytest.mark.multiprocess
def test_a_search_rerun_is_one_command_and_retrains_what_follows(mini):
    """The command for a rerun on purpose (docs/pipeline.md): the finished search is moved aside (not
    resumed), searched afresh, its record rewritten, and the runs after it retrained."""
    repo, _ = mini
    before = (repo / RECORD[1]).read_text()
    rerun = dvc(repo, "repro", "--force", "--downstream", "search@propulate")
    assert rerun.returncode == 0, rerun.stdout[-4000:] + rerun.stderr[-4000:]
    assert "holds a finished search with these settings" in rerun.stdout
    assert len(list((repo / "runs" / "search").glob("propulate.moved-*"))) >= 1
    assert "Running stage 'search@optuna'" not in rerun.stdout  # not downstream of it
    for name in RUN_NAMES:
        assert f"Running stage 'train@{name}'" in rerun.stdout
    after = (repo / RECORD[1]).read_text()
    assert after != before  # new evaluations (their times at least)
    assert len(after.splitlines()) == 2  # the budget: search.evaluations
    status = dvc(repo, "status", "--json")
    assert json.loads(status.stdout) == {}, status.stdout


@pytest.mark.multiprocess
def test_a_failed_experiment_keeps_the_committed_search_record(mini):
    """A search stage that fails (here a budget of 0) under `dvc exp run`: refused in one line
    before mpirun starts, and the record the runs train from left byte for byte."""
    repo, _ = mini
    text = (repo / "params.yaml").read_text()
    before = {path: (repo / path).read_bytes() for path in RECORD}
    try:
        run = dvc(repo, "exp", "run", "-S", "search.evaluations=0")
    finally:
        (repo / "params.yaml").write_text(text)
    assert run.returncode != 0
    said = run.stdout + run.stderr
    assert (
        "[pipeline] error: invalid search config: search.evaluations: "
        "Input should be greater than or equal to 1"
    ) in said
    assert "mpirun" not in said and "Traceback" not in said
    assert {path: (repo / path).read_bytes() for path in RECORD} == before


@pytest.mark.multiprocess
@pytest.mark.parametrize("key", ["train.optim.lr=0.00123", "search.evaluations=2"])
def test_set_changes_only_its_value_and_reruns_only_what_reads_it(mini, key):
    """`dvc exp run -S KEY=VALUE train@ddp-2x1`: params.yaml differs in that one line (its
    lists, flow mappings and comments kept as they are), and neither the searches nor the
    run train again: every run takes lr from the search's best, and a budget equal to the
    search's changes nothing. What `pipeline.preview` said beforehand is what ran."""
    repo, _ = mini
    text = (repo / "params.yaml").read_text()
    env = dvc_env()
    preview = subprocess.run(
        [sys.executable, "-m", "pipeline.preview", "-S", key],
        cwd=repo, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert preview.returncode == 0, preview.stderr
    assert "runs it retrains: none" in preview.stdout, preview.stdout
    try:
        run = dvc(repo, "exp", "run", "-S", key, "train@ddp-2x1")
        after = (repo / "params.yaml").read_text()
    finally:
        (repo / "params.yaml").write_text(text)
        dvc(repo, "repro", "--single-item", "resolve")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert "Running stage 'search@" not in run.stdout
    assert "Running stage 'train@" not in run.stdout
    old, new = text.splitlines(), after.splitlines()
    diff = "\n".join(difflib.unified_diff(old, new, "before", "after", lineterm="", n=1))
    changed = [(a, b) for a, b in zip(old, new) if a != b]
    dotted, value = key.split("=")
    if str(yaml.safe_load(text)["search"]["evaluations"]) == value and "evaluations" in dotted:
        assert after == text, diff  # the value it has: the file byte for byte
        return
    assert len(old) == len(new) and len(changed) == 1, diff
    assert changed[0][1].strip().startswith(f"{dotted.split('.')[-1]}: {value}"), diff


@pytest.mark.multiprocess
def test_the_preview_names_the_runs_an_edit_retrains(mini):
    repo, _ = mini
    env = dvc_env()
    preview = subprocess.run(
        [sys.executable, "-m", "pipeline.preview", "-S", "experiments.runs.ab-2x1.batch=global"],
        cwd=repo, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert preview.returncode == 0, preview.stderr
    said = preview.stdout
    assert "runs it retrains: ab-2x1\n" in said, said
    assert (
        "+      batch: global" in said
        and "`dvc exp run` would run, in order: prepare, resolve, train@ab-2x1, report" in said
    )


@pytest.mark.multiprocess
def test_exp_show_as_documented_fits_160_columns_with_the_headline_and_what_changed(mini):
    """docs/pipeline.md's `dvc exp show` line, after an experiment that changed one value:
    at 160 columns, the headline metrics and that value, nothing cut off."""
    import shlex

    repo, _ = mini
    docs = (ROOT / "docs" / "pipeline.md").read_text()
    line = re.search(r"\n(\.venv/bin/dvc exp show --only-changed [^\n]*)\n", docs)
    assert line, "docs/pipeline.md gives no `dvc exp show` line"
    git(repo, "add", "-A")  # the miniature as the baseline commit, as a user's own repo
    git(repo, "commit", "-qm", "the miniature")
    text = (repo / "params.yaml").read_text()
    try:
        assert dvc(repo, "exp", "run", "-S", "train.tracking.log_every=7").returncode == 0
    finally:
        (repo / "params.yaml").write_text(text)
        dvc(repo, "repro", "--single-item", "resolve")
    env = {**os.environ, "COLUMNS": "160", "PATH": f"{BIN}:{os.environ['PATH']}"}
    args = shlex.split(line[1])[1:]
    shown = subprocess.run(
        [str(BIN / "dvc"), *args, "--no-pager"], cwd=repo, env=env, capture_output=True, text=True
    )
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert max(len(x) for x in lines) <= 160, shown.stdout
    header = next(x for x in lines if "Experiment" in x)
    for column in ("ddp_top1", "ab_dtop1", "ab_bytes", "log_every"):
        assert column in header, shown.stdout
    assert "…" not in shown.stdout, shown.stdout


@pytest.mark.multiprocess
@pytest.mark.browser
def test_dvc_plots_show_draws_offline(mini):
    """`dvc plots show`: a page with Vega inline (no CDN), drawn by headless Chromium on a
    machine without a network."""
    import tempfile

    repo, _ = mini
    shown = dvc(repo, "plots", "show")
    assert shown.returncode == 0, shown.stderr
    page = (repo / "dvc_plots" / "index.html").read_text()
    assert "cdn.jsdelivr" not in page and "window.vegaEmbed=" in page
    from tools.mlflow_browser import CHROMIUM_FLAGS, chromium

    with tempfile.TemporaryDirectory() as profile:
        dom = subprocess.run(
            [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
             "--virtual-time-budget=15000", "--dump-dom",
             (repo / "dvc_plots" / "index.html").as_uri()],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert dom.stdout.count('class="marks"') >= 2, dom.stdout[-2000:]  # both charts drawn


def test_a_wrong_run_name_is_one_line():
    run = subprocess.run(
        [sys.executable, "-m", "pipeline.retrain", "no-such-run"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and "no run named 'no-such-run'" in run.stderr


@pytest.mark.multiprocess
def test_a_damaged_record_is_named_with_its_restore_command_and_reruns_nothing(mini):
    """The search's best.json cut short, as a bad copy or a full disk leaves it: the stage
    that reads it for the runs (resolve) and the search stage each end in one line naming the file and the command that
    restores it; the search does not start again. Restored as told, nothing is stale. The
    report's length study the same."""
    repo, _ = mini
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    # (an earlier test may have committed them already)
    subprocess.run(
        [*git, "commit", "--allow-empty", "-qm", "the miniature's records"], cwd=repo, check=True
    )
    best = Path("results/search/propulate/best.json")
    text = (repo / best).read_text()
    (repo / best).write_text(text[: len(text) // 2])
    search_state = repo / "runs" / "search" / "propulate" / "search.json"
    stamp = search_state.stat().st_mtime_ns
    restore = f"restore the committed copy: git checkout -- {best}"
    for stage_name in ("resolve", "search@propulate"):
        run = dvc(repo, "repro", "-s", stage_name)
        assert run.returncode != 0, run.stdout[-3000:]
        said = [line for line in run.stderr.splitlines() if line.startswith("[pipeline] error:")]
        assert len(said) == 1 and f"{best} is damaged (not whole JSON" in said[0], run.stderr
        assert said[0].endswith(restore), said[0]
        assert "Traceback" not in run.stdout + run.stderr
    assert "done before" not in run.stdout  # no search began
    assert search_state.stat().st_mtime_ns == stamp
    subprocess.run(["git", "checkout", "--", str(best)], cwd=repo, check=True)
    status = dvc(repo, "status", "search@propulate", "resolve", "train@ab-2x1")
    assert "changed" not in status.stdout, status.stdout
    # a study's record read by the report
    lengths = Path("reports/lengths/lengths.json")
    (repo / lengths).write_text("{")
    run = dvc(repo, "repro", "-s", "report")
    assert run.returncode != 0
    assert f"{lengths} is damaged" in run.stderr and f"git checkout -- {lengths}" in run.stderr
    subprocess.run(["git", "checkout", "--", str(lengths)], cwd=repo, check=True)


# ---------------------------------------------------------------- faults as they happen
def outputs(repo: Path) -> dict[str, bytes]:
    """What the stages commit: results, metrics, plots, the report and dvc.lock."""
    found = [repo / "dvc.lock"]
    for top in ("results", "metrics", "plots", "reports"):
        found += [f for f in (repo / top).rglob("*") if f.is_file()]
    return {str(f.relative_to(repo)): f.read_bytes() for f in found}


def descendants(pid: int) -> dict[int, Proc]:
    """The live processes `pid` started, and theirs (a launcher's nodes start sessions of
    their own, so a session does not hold them all)."""
    procs, found, todo = processes(), {}, [pid]
    while todo:
        parent = todo.pop()
        for child, p in procs.items():
            if p.parent == parent and child not in found:
                found[child] = p
                todo.append(child)
    return found


def in_background(cmd: list[str], repo: Path) -> subprocess.Popen:
    """`cmd` in the repository, as a user starts it from a shell, its output dropped."""
    return subprocess.Popen(
        cmd, cwd=repo, env=dvc_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip


def alive(pids) -> dict[int, Proc]:
    procs = processes()
    return {p: procs[p] for p in pids if p in procs}


def wait_until(what, seconds: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + seconds
    while not what():
        assert time.monotonic() < deadline, f"not within {seconds} s"
        assert proc is None or proc.poll() is None, "the command ended first"
        time.sleep(0.2)


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "value, said",
    [
        ("experiments.epochs=-1", "experiments.epochs: Input should be greater than 0"),
        ("experiments.epochs=0.0001", "experiments.epochs=0.0001 is no whole step of run"),
        ("+experiments.runs.ab-2x1.epoch=1", "experiments.runs.ab-2x1.epoch: unknown key"),
    ],
    ids=["negative", "under-a-step", "unknown-key"],
)
def test_a_bad_matrix_value_through_dvc_exp_run_is_refused_before_any_run_trains(mini, value, said):
    """In one line naming the key (and the run), no committed file changed, and a second
    line saying what `-S` left in params.yaml and how to undo it."""
    repo, _ = mini
    text, before = (repo / "params.yaml").read_text(), outputs(repo)
    try:
        run = dvc(repo, "exp", "run", "-S", value)
        left = (repo / "params.yaml").read_text()
    finally:
        (repo / "params.yaml").write_text(text)
    assert run.returncode != 0
    errors = [line for line in run.stderr.splitlines() if line.startswith("[pipeline] error:")]
    assert len(errors) == 1 and said in errors[0], run.stderr
    key = value.lstrip("+").split("=")[0]  # never committed: it differs from any commit
    notes = [line for line in run.stderr.splitlines() if "differs from its last commit" in line]
    # the key, or the entry holding it where the last commit has no such entry at all
    parts = key.split(".")
    named = [".".join(parts[:n]) for n in range(len(parts), 1, -1)]
    said = notes[0].replace(",", " ") if notes else ""
    assert len(notes) == 1 and any(f" {k} " in said for k in named), run.stderr
    assert notes[0].endswith("`git checkout params.yaml` undoes them")
    assert left != text  # what the note says: -S left its value there
    assert "Traceback" not in run.stdout + run.stderr and "torchrun" not in run.stdout
    assert outputs(repo) == before


@pytest.mark.multiprocess
def test_dvc_killed_during_a_stage_takes_the_stage_and_its_ranks_with_it(mini, tmp_path):
    """`kill -9` of `dvc exp run` while its train stage trains: the stage, its torchruns and
    ranks end within seconds, and none of the stage's committed files changes (the stages
    before it finished under DVC, and wrote theirs, as an experiment does)."""
    repo, _ = mini
    folder = repo / "runs" / "train" / "ddp-2x1"
    text, before = (repo / "params.yaml").read_text(), outputs(repo)
    shutil.copytree(folder, tmp_path / "kept")
    value = 'experiments.set=["optim.lr=0.00077"]'  # a value the run trains with
    # 300 epochs of 6 steps: the run still trains when the kill comes, on a loaded machine too
    longer = "experiments.epochs=300"
    cmd = [str(BIN / "dvc"), "exp", "run", "-S", value, "-S", longer, "train@ddp-2x1"]
    proc = in_background(cmd, repo)
    tree: dict[int, Proc] = {}
    try:

        def training() -> bool:  # both ranks started
            tree.update(descendants(proc.pid))
            return sum(p.is_rank() for p in alive(tree).values()) == 2

        wait_until(training, 300, proc)
        assert any("pipeline.train ddp-2x1" in p.command for p in tree.values())
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 30
        while left := alive(tree):
            assert time.monotonic() < deadline, f"alive 30 s after the kill: {left}"
            time.sleep(0.2)
    finally:
        for pid in alive(tree):  # a failed test leaves nothing training either
            os.kill(pid, signal.SIGKILL)
        (repo / "params.yaml").write_text(text)
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(tmp_path / "kept", folder)
        after = outputs(repo)
        for path, data in before.items():  # the experiment's resolved values and lock
            (repo / path).write_bytes(data)
    mine = [f"{top}/ddp-2x1.json" for top in ("results", "metrics", "plots")]
    assert [after[p] for p in mine] == [before[p] for p in mine]
    assert {p: v for p, v in after.items() if p.startswith("reports/")} == {
        p: v for p, v in before.items() if p.startswith("reports/")
    }
    status = dvc(repo, "status", "train@ddp-2x1")  # DVC's own lock let go with it
    assert status.returncode == 0 and "changed" not in status.stdout, status.stdout


@pytest.mark.multiprocess
def test_a_second_retrain_of_a_run_is_refused_before_it_moves_anything(mini):
    """While `pipeline.retrain ab-2x1` trains, a second one ends in one line and leaves the
    first's run folder as it is; the first, stopped, takes DVC and its ranks with it."""
    repo, _ = mini
    folder = repo / "runs" / "train" / "ab-2x1"
    before = outputs(repo)
    cmd = [sys.executable, "-m", "pipeline.retrain", "ab-2x1"]
    aside = set(folder.parent.glob("ab-2x1.moved-*"))
    first = in_background(cmd, repo)
    tree: dict[int, Proc] = {}
    try:

        def training() -> bool:  # its folder moved aside, and a new one started
            tree.update(descendants(first.pid))
            moved = set(folder.parent.glob("ab-2x1.moved-*")) - aside
            return bool(moved) and (folder / "config.json").exists()

        wait_until(training, 300, first)
        second = subprocess.run(
            cmd, cwd=repo, env=dvc_env(), capture_output=True, text=True, timeout=120
        )
        assert second.returncode == 2 and second.stdout == "", second.stdout
        assert second.stderr.count("\n") == 1, second.stderr
        assert "ab-2x1 is being trained again already" in second.stderr
        assert "nothing moved" in second.stderr
        assert (folder / "config.json").exists()
        assert len(set(folder.parent.glob("ab-2x1.moved-*")) - aside) == 1
        tree.update(descendants(first.pid))
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=60)
        wait_until(lambda: not alive(tree), 30)
    finally:
        for pid in alive(tree):
            os.kill(pid, signal.SIGKILL)
        moved = sorted(set(folder.parent.glob("ab-2x1.moved-*")) - aside)
        if moved:
            shutil.rmtree(folder, ignore_errors=True)
            os.rename(moved[0], folder)
        for path, data in before.items():  # what the first wrote before it was stopped
            (repo / path).write_bytes(data)
