"""`dvc repro` for real on a miniature pipeline, in a temporary copy of the repository."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from tests.conftest import ROOT

BIN = Path(sys.executable).parent
TINY_VIT = {
    "name": "vit",
    "image_size": 16,
    "patch_size": 4,
    "width": 32,
    "depth": 2,
    "heads": 2,
    "mlp_ratio": 2.0,
    "qkv_bias": False,
    "drop_path": 0.0,
    "init": "ortho_sigma",
}


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


def dvc(repo: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1"}
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
    params = miniature(yaml.safe_load((repo / "params.yaml").read_text()), tmp / "images")
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    first = dvc(repo, "repro")
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    return repo, first


def test_repro_runs_every_stage_to_a_report_with_measured_numbers(mini):
    repo, _ = mini
    for name in ("ddp-2x1", "ab-2x1", "ab-2x1-global"):
        s = json.loads((repo / "metrics" / f"{name}.json").read_text())
        assert s["steps"] > 0 and s["traffic"]["inter_node_bytes"] > 0
        assert (repo / "runs" / "train" / name / "train_log.csv").exists()
    best = json.loads((repo / "runs/search/propulate/best.json").read_text())
    assert best["evaluations"] == 2
    cfg = json.loads((repo / "runs/train/ab-2x1/config.json").read_text())
    assert cfg["optim"]["lr"] == pytest.approx(best["params"]["optim.lr"])  # use_best
    report = (repo / "reports" / "README.md").read_text()
    ab = next(line for line in report.splitlines() if line.startswith("| ab-2x1 | ab |"))
    assert "—" not in ab.split("|")[6]  # a measured MB/step, not a gap
    for png in (
        "traffic_vs_scale.png",
        "accuracy_loss_compression_vs_batch.png",
        "learning_curves.png",
        "search_comparison.png",
    ):
        assert (repo / "reports" / png).stat().st_size > 1000
    rows = list((repo / "reports" / "table1_traffic.csv").read_text().splitlines())
    assert len(rows) == 4  # header + 3 runs
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{repo / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("abtrain").experiment_id])
    names = {r.info.run_name for r in runs}
    assert {"search-propulate", "search-optuna"} <= names
    assert sum(1 for r in runs if r.data.tags.get("dataset") == "imagefolder") == 3  # trainings


def test_second_repro_does_nothing(mini):
    repo, _ = mini
    again = dvc(repo, "repro")
    assert again.returncode == 0
    assert "Running stage" not in again.stdout
    assert "up to date" in (again.stdout + again.stderr).lower()


def test_changing_the_search_space_reruns_the_search_and_what_follows(mini):
    repo, _ = mini
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["search"]["space"]["ab.sigma_cutoff"]["high"] = 0.3
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    status = dvc(repo, "status", "--json")
    changed = set(json.loads(status.stdout))
    assert {"search@propulate", "search@optuna", "train@ab-2x1"} <= changed
    assert "prepare" not in changed
    dag = dvc(repo, "dag", "--dot").stdout  # and the report follows them
    edges = set(re.findall(r'"([^"]+)" -> "([^"]+)"', dag))
    assert {
        ("search@optuna", "report"),
        ("search@propulate", "train@ab-2x1"),
        ("train@ab-2x1", "report"),
    } <= edges


def test_missing_runs_leave_a_gap_not_a_crash(mini, tmp_path):
    repo, _ = mini
    (repo / "metrics" / "ab-2x1-global.json").rename(tmp_path / "kept.json")
    try:
        env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
        proc = subprocess.run(
            [sys.executable, "-m", "pipeline.report"],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        report = (repo / "reports" / "README.md").read_text()
        assert (
            "| ab-2x1-global | — |" in report
            and "missing from this report: ab-2x1-global" in report
        )
    finally:
        (tmp_path / "kept.json").rename(repo / "metrics" / "ab-2x1-global.json")


def test_offline_dvc_plots_bundle_their_scripts(mini):
    repo, _ = mini
    page = repo / "reports" / "plots" / "index.html"
    if not page.exists():
        pytest.skip("npm could not fetch vega here; the report says so")
    html = page.read_text()
    assert "cdn.jsdelivr" not in html and "vegaEmbed" in html and len(html) > 500_000


def test_the_paper_profile_validates_and_every_stage_resolves(tmp_path, monkeypatch):
    from pipeline import common, slurm
    from search import space

    paper = yaml.safe_load((ROOT / "profiles" / "paper.yaml").read_text())
    monkeypatch.setattr(
        common, "train_size", lambda cfg: {"imagenet": 1_281_167, "cifar10": 50_000}[cfg.data.name]
    )
    runs = common.runs(paper)
    assert len(runs) == 57
    for run in runs.values():
        sets = common.run_overrides(paper, run, None)
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
    vit = common.run_overrides(paper, runs["vit-ab-2n-local"], None)
    assert "steps=90000" in vit and "batch_size=256" in vit  # the authors' 2-node run length
    assert "batch_size=128" in common.run_overrides(paper, runs["vit-ab-8n-global"], None)
    assert "batch_size=32" in common.run_overrides(paper, runs["vit-ab-32n-global"], None)
    s = space.load(paper["search"])
    space.check_keys(s.space, paper["train"])
    # the search's CIFAR-100 too: nothing else prepares it, and unprepared, every one of the
    # search's runs would crash into the penalty
    assert {d.name for d in common.data_configs(paper)} == {"imagenet", "cifar10", "cifar100"}
    repo = tmp_path / "repo"
    copy_repo(repo)
    shutil.copy(ROOT / "profiles" / "paper.yaml", repo / "params.yaml")
    listed = dvc(repo, "stage", "list")
    assert listed.returncode == 0, listed.stderr
    assert "train@vgg-ab-2n" in listed.stdout and "train@r50-abng-32n-global" in listed.stdout
