"""The miniature run: a fresh working copy of this repository with the miniature's
params, `dvc repro` in it (on the local SLURM cluster or an existing one), and the
command line, `python -m pipeline.miniature`."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import yaml

from pipeline.miniature.data import write_sources
from pipeline.miniature.profile import PAPER, ROOT, miniature, overrides, validate

SHARED_CIFAR10 = ROOT.parent / "shared" / "data" / "cifar10-jpg.tar.gz"
MARK = ".paper-mini"
# Each run keeps its last checkpoint and weights: ViT-B/16's ab run alone writes 3.7 GB, the
# four held 7.8 GB at the peak measured, the rest of the suite 2.8 GB beside them
# (docs/testing.md); a disk that fills fails a stage minutes in
DISK_NEEDED = 12e9


def disk_shortfall(folder: Path) -> str | None:
    """Why `folder` (or its nearest existing parent) cannot hold a miniature, or None."""
    while not folder.exists():
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    if free >= DISK_NEEDED:
        return None
    return (
        f"the paper miniature writes about {DISK_NEEDED / 1e9:.0f} GB of checkpoints and "
        f"weights; {folder} has {free / 1e9:.1f} GB free"
    )


# ---------------------------------------------------------------- the working copy
def working_copy(dest: Path) -> None:
    """This repository's files (tracked and new, not ignored) without its results, as a
    git repository of its own, with this checkout's .venv linked in."""
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    results = ("dvc.lock", "metrics/", "results/", "plots/", "reports/")  # the default profile's
    # committed benchmarks the report reads: reports/seeds/, every reports/seeds-*/ study,
    # the search-rerun and training-length studies
    inputs = ("reports/seeds", "reports/table2/", "reports/search-reruns/", "reports/lengths/")
    inputs += ("reports/tradeoff/",)
    for f in files:
        if f and (ROOT / f).is_file() and (not f.startswith(results) or f.startswith(inputs)):
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, dest / f)
    git = ["git", "-c", "user.email=paper-mini@localhost", "-c", "user.name=paper-mini"]
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "paper profile in miniature"]):
        subprocess.run(git + cmd, cwd=dest, check=True)
    freeze_paper_scale(dest)
    if (ROOT / ".venv").is_dir():
        (dest / ".venv").symlink_to(ROOT / ".venv")  # `source .venv/bin/activate` in jobs


def freeze_paper_scale(repo: Path) -> None:
    """The paper_scale stage predicts the paper's own scale and checks its model against the
    committed benchmark: a miniature's smaller `train` would only make it predict for a
    model nobody benchmarked (and cost a minute). Frozen, its committed paper_scale.json stays
    what the report reads."""
    dvc = Path(sys.executable).with_name("dvc")
    subprocess.run(
        [str(dvc) if dvc.exists() else "dvc", "freeze", "-q", "paper_scale"], cwd=repo, check=True
    )


def fresh(out: Path) -> None:
    if out.exists():
        if not (out / MARK).exists():
            raise SystemExit(f"{out} exists and is not a miniature's folder: choose another --out")
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / MARK).write_text("made by python -m pipeline.miniature; removed by the next run\n")


# ---------------------------------------------------------------- running it
def repro(repo: Path, log: Path, env: dict[str, str]) -> int:
    """`dvc repro` in the working copy; its output to this terminal and to `log`."""
    env = {
        **env,
        "PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '')}",
        "DVC_NO_ANALYTICS": "1",
    }
    if os.geteuid() == 0:  # Open MPI refuses root unless told (the search's mpirun)
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    with open(log, "w") as f:
        proc = subprocess.Popen(
            ["dvc", "repro"],
            cwd=repo,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            f.write(line)
            f.flush()
        return proc.wait()


def summarize(repo: Path, plan: dict[str, dict[str, Any]]) -> list[str]:
    lines = [
        "| run | model | method | nodes × ranks | steps | best top-1 | inter-node MB/step/rank |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, p in plan.items():
        path = repo / "results" / f"{name}.json"
        cells = ["—"] * 3
        if path.exists():
            s = json.loads(path.read_text())
            mb = s["traffic"]["inter_node_bytes"] / s["steps"] / 1e6
            cells = [str(s["steps"]), f"{s['val_top1']['best']:.2f}%", f"{mb:.2f}"]
        lines.append(
            f"| {name} | {p['model']} | {p['method']} | {p['nodes']} × {p['ranks_per_node']} | "
            + " | ".join(cells)
            + " |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    import pipeline.miniature  # its docstring is the command's description

    ap = argparse.ArgumentParser(
        prog="python -m pipeline.miniature", description=pipeline.miniature.__doc__
    )
    ap.add_argument(
        "--out", default=str(ROOT / "out" / "paper-mini"), help="its folder (made afresh)"
    )
    ap.add_argument(
        "--cluster",
        choices=["local", "existing"],
        default="local",
        help="local: start the tests' SLURM cluster on this machine; existing: use sbatch as is",
    )
    ap.add_argument(
        "--cifar10",
        default=str(SHARED_CIFAR10),
        help="CIFAR-10 as an ImageFolder archive (absent: a generated CIFAR-10 archive)",
    )
    ap.add_argument("--no-repro", action="store_true", help="write the data, params and copy only")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    t0 = time.monotonic()
    out = Path(args.out).resolve()
    if not args.no_repro and (why := disk_shortfall(out)):
        raise SystemExit(f"error: {why}: choose another --out")
    fresh(out)
    src, counts = write_sources(out / "sources", Path(args.cifar10))
    paper = yaml.safe_load(PAPER.read_text())
    params, changed = miniature(paper, src)
    plan = validate(params, counts)
    repo = out / "repo"
    working_copy(repo)
    header = (
        "# profiles/paper.yaml in miniature, written by `python -m pipeline.miniature`:\n"
        "# only the keys listed in pipeline/miniature/profile.py (overrides()) differ.\n"
    )
    (repo / "params.yaml").write_text(
        header + yaml.safe_dump(params, sort_keys=False, width=1 << 30)
    )
    record = dict(
        overrides=[dict(path=p, value=v, kind=k) for p, v, k in overrides(src)],
        changed=changed,
        runs=plan,
        sources=src,
        counts=counts,
        repo=str(repo),
    )
    print(f"[miniature] {len(changed)} values of profiles/paper.yaml changed; runs:", flush=True)
    for name, p in plan.items():
        print(
            f"[miniature]   {name}: {p['model']} {p['method']}, {p['nodes']} nodes × "
            f"{p['ranks_per_node']} rank, {p['steps']} steps of {p['batch_size']}/rank",
            flush=True,
        )
    if args.no_repro:
        (out / "miniature.json").write_text(json.dumps(record, indent=2))
        print(f"[miniature] not run: cd {repo} && dvc repro", flush=True)
        return 0
    if args.cluster == "local":
        from tests import slurm_cluster

        if not slurm_cluster.available():
            raise SystemExit(
                "the local SLURM cluster needs Debian's slurmctld, slurmd and slurm-client: "
                "apt-get install -y --no-install-recommends slurmctld slurmd slurm-client"
            )
        cluster = slurm_cluster.local_cluster(out / "slurm")
    else:
        cluster = nullcontext(dict(os.environ))
    t1 = time.monotonic()
    with cluster as env:
        code = repro(repo, out / "repro.log", env)
    t2 = time.monotonic()
    record.update(returncode=code, wall_seconds=dict(setup=t1 - t0, repro=t2 - t1, total=t2 - t0))
    (out / "miniature.json").write_text(json.dumps(record, indent=2))
    print("\n".join(summarize(repo, plan)))
    print(
        f"[miniature] dvc repro exited {code} after {t2 - t1:.0f} s ({t2 - t0:.0f} s in all); "
        f"report: {repo / 'reports' / 'README.md'}",
        flush=True,
    )
    return code
