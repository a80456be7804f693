"""The paper's profile in miniature (`python -m pipeline.miniature`), for real: generated data
in the real formats, the Propulate and Optuna searches under mpirun, ab of ViT-B/16 and
VGG16 and ddp of VGG16 on 2 nodes, all through `dvc repro` with the SLURM
launcher on the local cluster, to the report."""

import csv
import fnmatch
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from abtrain.config import parse_override
from pipeline import miniature
from pipeline.miniature.run import disk_shortfall
from tests import slurm_cluster
from tests.helpers import ROOT

needs_slurm = pytest.mark.skipif(
    not slurm_cluster.available(), reason="Debian's slurmctld/slurmd/slurm-client are not installed"
)
SET_LISTS = ("search.train", "experiments.runs.*.set")


def leaves(p, prefix=""):
    """Dotted path -> value; a run's `set` list and `search.train` read key by key."""
    if isinstance(p, list) and any(fnmatch.fnmatchcase(prefix, s) for s in SET_LISTS):
        p = {".".join(k): v for k, v in map(parse_override, p)}
    if isinstance(p, dict) and p:
        out = {}
        for k, v in p.items():
            out.update(leaves(v, f"{prefix}.{k}" if prefix else k))
        return out
    return {prefix: p}


def changed_paths(paper: dict, mini: dict) -> set[str]:
    """What differs between the paper's profile and a miniature, over the runs it kept."""
    kept = set(mini["experiments"]["runs"])
    assert kept <= set(paper["experiments"]["runs"]), "runs the paper doesn't have"
    paper = {**paper, "experiments": dict(paper["experiments"])}
    paper["experiments"]["runs"] = {
        k: v for k, v in paper["experiments"]["runs"].items() if k in kept
    }
    a, b = leaves(paper), leaves(mini)
    return {k for k in a.keys() | b.keys() if a.get(k, "<absent>") != b.get(k, "<absent>")}


def declared(paper: dict, patterns: list[str], kept: set[str]) -> set[str]:
    paths = leaves(paper).keys()
    out = set()
    for pattern in patterns:
        hits = {
            p
            for p in paths
            if fnmatch.fnmatchcase(p, pattern)
            and (not p.startswith("experiments.runs.") or p.split(".")[2] in kept)
        }
        assert hits, f"declared override {pattern} matches nothing"
        out |= hits
    return out


def paper() -> dict:
    return yaml.safe_load((ROOT / "profiles" / "paper.yaml").read_text())


@pytest.mark.pipeline  # pipeline.miniature writes the miniature's repository
def test_the_miniature_differs_from_the_paper_only_in_its_declared_keys(tmp_path):
    """Without running it: the params written, against profiles/paper.yaml, key by key."""
    out = tmp_path / "mini"
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline.miniature", "--out", str(out), "--no-repro"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    mini = yaml.safe_load((out / "repo" / "params.yaml").read_text())
    record = json.loads((out / "miniature.json").read_text())
    patterns = [o["path"] for o in record["overrides"]]
    kept = set(mini["experiments"]["runs"])
    assert kept == set(miniature.RUNS)
    assert changed_paths(paper(), mini) == declared(paper(), patterns, kept)
    # sizes, not models: ViT-B/16 as the paper has it, at 224 px
    assert mini["train"]["model"] == paper()["train"]["model"]
    assert mini["train"]["model"]["arch"] == "vit_base_patch16_224"
    assert (
        mini["train"]["model"]["kwargs"]["img_size"] == mini["train"]["data"]["image_size"] == 224
    )
    assert not any(p.startswith("train.model.") for p in patterns)
    # and the check catches what isn't declared: a narrower ViT-B/16, a dropped node
    mini["train"]["model"]["kwargs"]["embed_dim"] = 384
    mini["experiments"]["runs"]["vit-ab-2n-local"]["nodes"] = 1
    assert changed_paths(paper(), mini) - declared(paper(), patterns, kept) == {
        "train.model.kwargs.embed_dim",
        "experiments.runs.vit-ab-2n-local.nodes",
    }


def test_a_disk_too_small_for_the_miniature_is_refused_before_it_writes(tmp_path, monkeypatch):
    from pipeline.miniature import run as mini_run

    free = shutil.disk_usage(tmp_path).free
    monkeypatch.setattr(mini_run, "DISK_NEEDED", free * 2.0)  # this disk, as a small one
    with pytest.raises(SystemExit) as refused:
        mini_run.main(["--out", str(tmp_path / "mini")])
    assert "GB free" in str(refused.value) and str(tmp_path) in str(refused.value)
    assert not (tmp_path / "mini").exists()


def test_the_generated_cifar100_archive_has_the_published_layout(tmp_path):
    """GNU tar members cifar-100-python/{train,test,meta}; py2 pickles, as the real one."""
    import pickle
    import tarfile

    import numpy as np

    archive, n = miniature.write_cifar100(tmp_path, np.random.default_rng(0))
    with tarfile.open(archive) as tar:
        names = {m.name for m in tar if m.isfile()}
        blobs = {Path(m).name: tar.extractfile(m).read() for m in names}
    assert names == {f"cifar-100-python/{f}" for f in ("train", "test", "meta")}
    train = pickle.loads(blobs["train"], encoding="bytes")  # the published files' str keys
    assert list(train) == [b"filenames", b"batch_label", b"fine_labels", b"coarse_labels", b"data"]
    assert train[b"data"].dtype == np.uint8 and train[b"data"].shape == (n, 3072)
    assert sorted(set(train[b"fine_labels"])) == list(range(100))
    meta = pickle.loads(blobs["meta"], encoding="latin1")
    assert len(meta["fine_label_names"]) == 100 and len(meta["coarse_label_names"]) == 20


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("paper-mini") / "mini"
    if why := disk_shortfall(out):  # a full disk would fail a stage ten minutes in
        pytest.skip(why)
    repo = out / "repo"
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pipeline.miniature", "--out", str(out)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        print(f"pipeline.miniature: {time.monotonic() - t0:.0f} s")
        assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
        yield out, repo, json.loads((out / "miniature.json").read_text())
    finally:  # GBs of checkpoints and weights; the logs stay
        for big in [*repo.glob("runs/train/*/checkpoints"), repo / "mlruns", repo / "mlartifacts"]:
            shutil.rmtree(big, ignore_errors=True)
        for weights in repo.glob("runs/train/*/model.pt"):
            weights.unlink()


@needs_slurm  # the `run` fixture: dvc repro, SLURM jobs of torchrun and mpirun
@pytest.mark.pipeline
@pytest.mark.cluster
@pytest.mark.multiprocess
def test_repro_ran_ab_of_both_models_and_a_ddp_run_on_two_slurm_nodes(run):
    out, repo, record = run
    mini = yaml.safe_load((repo / "params.yaml").read_text())
    assert changed_paths(paper(), mini) == set(record["changed"])  # what ran is what's declared
    log = (out / "repro.log").read_text()
    jobs = re.findall(r"SLURM job \d+ \((\S+)\) completed", log)
    assert sorted(jobs) == sorted([*miniature.RUNS, "search", "search"])  # propulate, optuna
    seen = set()
    for name in miniature.RUNS:
        s = json.loads((repo / "results" / f"{name}.json").read_text())
        cfg = json.loads((repo / "runs" / "train" / name / "config.json").read_text())
        assert s["steps"] == cfg["steps"] == record["runs"][name]["steps"] >= 2
        assert s["world_size"] == 2 and s["nodes"] == 2, name
        assert s["run"]["nodes"] == 2 and s["run"]["ranks_per_node"] == 1
        assert s["traffic"]["inter_node_bytes"] > 0
        assert (repo / "runs" / "train" / name / "job.sbatch").read_text().count("--nodes=2") == 1
        assert list((repo / "runs" / "train" / name).glob("slurm-*.log")), name
        seen.add((s["run"]["model"], s["method"]))
        if s["run"]["model"] == "vgg16":
            assert cfg["model"]["factory"] == "abtrain.models.vgg:vgg16"
            assert cfg["data"]["image_size"] == 32
        else:
            assert cfg["data"]["name"] == "imagenet" and cfg["data"]["image_size"] == 224
        if s["method"] == "ab":
            assert s["compression_ratio"] is not None  # it factorised
    # ab of both models (its warm-up and rebound steps: DDP steps of that model), and ddp
    assert seen == {("vgg16", "ddp"), ("vit_base_patch16_224", "ab"), ("vgg16", "ab")}


@needs_slurm  # the `run` fixture: dvc repro, SLURM jobs of torchrun and mpirun
@pytest.mark.pipeline
@pytest.mark.cluster
@pytest.mark.multiprocess
def test_the_searches_ran_their_budget_under_mpirun_on_the_generated_cifar100(run):
    _, repo, _ = run
    budget = yaml.safe_load((repo / "params.yaml").read_text())["search"]["evaluations"]
    for backend in ("propulate", "optuna"):
        rows = [
            json.loads(line)
            for line in (repo / "runs" / "search" / backend / "evaluations.jsonl").open()
        ]
        assert len(rows) == budget, backend
        assert any(r["status"] == "ok" and len(r["errors"]) == 2 for r in rows), rows
        script = (repo / "runs" / "search" / f"{backend}-job" / "job.sbatch").read_text()
        assert "--nodes=2" in script and "mpirun" in script
    meta = json.loads((repo / "data" / "prepared" / "cifar100" / "meta.json").read_text())
    assert len(meta["classes"]) == 100


@needs_slurm  # the `run` fixture: dvc repro, SLURM jobs of torchrun and mpirun
@pytest.mark.pipeline
@pytest.mark.cluster
@pytest.mark.multiprocess
def test_the_report_names_every_run_and_both_searches(run):
    _, repo, _ = run
    report = (repo / "reports" / "README.md").read_text()
    for name in miniature.RUNS:
        assert re.search(rf"^\| {re.escape(name)} \|", report, re.M), name
    assert "| propulate |" in report and "| optuna |" in report
    rows = list(csv.DictReader((repo / "reports" / "table1_traffic.csv").open()))
    assert [r["run"] for r in rows] == list(miniature.RUNS)
    by_name = {r["run"]: r for r in rows}
    ab, ddp = by_name["vgg-ab-2n"], by_name["vgg-ddp-2n"]  # against its own model
    ratio = float(ab["inter_bytes_per_step"]) / float(ddp["inter_bytes_per_step"])
    assert float(ab["ratio_to_ddp"]) == pytest.approx(ratio)
