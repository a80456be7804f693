"""The paper's scale on paper: predicted inter-node bytes per rank per step for the paper
profile's ViT-B/16 and ResNet-50 runs at 2-32 nodes, beside the paper's Table 1; and for
every run of the matrix what it keeps: memory per GPU, checkpoint bytes and disk, ledger
and log records (`abtrain.planner.footprint`).

    python -m bench.planner    # writes bench/results/planner.json and prints two tables

The ranks training keeps are an assumption (`keep`, a fraction of each layer's full rank);
both full rank (1.0) and half (0.5) are shown.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from abtrain import config as abconfig
from abtrain.checkpoint import atomic_write_text
from abtrain.config import AB_METHODS
from abtrain.planner import footprint, plan
from pipeline.common import base_config, run_overrides, runs

IMAGENET_TRAIN = 1_281_167
PAPER = Path("profiles/paper.yaml")
# (training images, classes) of the data sets the matrix uses, which needn't be here
DATASETS = {"imagenet": (IMAGENET_TRAIN, 1000), "cifar10": (50_000, 10), "cifar100": (50_000, 100)}


def main() -> int:
    p = yaml.safe_load(PAPER.read_text())
    ref = json.loads(Path("pipeline/paper_reference.json").read_text())["table1"]["rows"]
    rows = []
    for name, run in runs(p).items():
        if not name.startswith(("vit-", "r50-")) or run.method == "ab_nogroups":
            continue
        cfg = abconfig.from_dict(p["train"], run_overrides(p, run, None, size=IMAGENET_TRAIN))
        for keep in (1.0, 0.5):
            pl = plan(cfg, run.nodes, run.ranks_per_node, classes=1000, keep=keep)
            rows.append(
                dict(
                    run=name,
                    model=name.split("-")[0],
                    method=run.method,
                    nodes=run.nodes,
                    batch=run.batch,
                    keep=keep,
                    inter_bytes_per_step=pl.per_step,
                )
            )
    kept = []
    for name, run in runs(p).items():
        size, classes = DATASETS[base_config(p, run).data.name]
        cfg = abconfig.from_dict(p["train"], run_overrides(p, run, None, size=size))
        for keep in (1.0, 0.5) if run.method in AB_METHODS else (1.0,):
            f = footprint(cfg, run.nodes, run.ranks_per_node, classes, keep)
            kept.append(
                dict(
                    run=name,
                    method=run.method,
                    nodes=run.nodes,
                    world=run.world,
                    batch=run.batch,
                    steps=cfg.steps,
                    keep=keep,
                    **vars(f),
                )
            )
    out = []
    for r in rows:
        if r["method"] != "ab":
            continue
        ddp = next(
            x
            for x in rows
            if x["method"] == "ddp"
            and x["model"] == r["model"]
            and x["nodes"] == r["nodes"]
            and x["batch"] == r["batch"]
            and x["keep"] == 1.0
        )
        label = {"vit": "ViT-B/16", "r50": "ResNet-50"}[r["model"]]
        paper = next((x for x in ref if x["model"] == label and x["N"] == r["nodes"]), None)
        pr = None
        if paper and paper[f"{r['batch']}_baseline"]:
            pr = paper[f"{r['batch']}_ab"] / paper[f"{r['batch']}_baseline"]
        out.append(
            dict(
                **r,
                ddp_bytes_per_step=ddp["inter_bytes_per_step"],
                predicted_ratio=r["inter_bytes_per_step"] / ddp["inter_bytes_per_step"],
                paper_ratio=pr,
            )
        )
    Path("bench/results").mkdir(parents=True, exist_ok=True)
    atomic_write_text(
        Path("bench/results/planner.json"), json.dumps(dict(traffic=out, footprint=kept), indent=2)
    )
    print(
        f"{'model':<6}{'nodes':>6}{'batch':>7}{'keep':>6}{'ddp MB/step':>13}"
        f"{'ab MB/step':>12}{'ab/ddp':>8}{'paper':>7}"
    )
    for r in out:
        paper = f"{r['paper_ratio']:.2f}" if r["paper_ratio"] else "—"
        print(
            f"{r['model']:<6}{r['nodes']:>6}{r['batch']:>7}{r['keep']:>6}"
            f"{r['ddp_bytes_per_step'] / 1e6:>13.1f}{r['inter_bytes_per_step'] / 1e6:>12.1f}"
            f"{r['predicted_ratio']:>8.3f}{paper:>7}"
        )
    print_footprint(kept)
    return 0


def print_footprint(rows: list[dict]) -> None:
    gb = 1e9
    print(
        f"\n{'run':<22}{'keep':>5}{'steps':>7}{'GPU GB':>8}{'ckpt GB':>9}{'disk GB':>9}"
        f"{'csv rows':>10}{'csv MB':>8}{'log MB':>8}{'ledger MB':>10}"
        f"{'coll. rows':>12}{'coll. GB':>10}"
    )
    for r in rows:
        c, led = r["checkpoint"], r["ledger"]
        peak = max(m["total"] for m in r["memory"].values())
        print(
            f"{r['run']:<22}{r['keep']:>5}{r['steps']:>7}{peak / gb:>8.2f}{c['bytes'] / gb:>9.2f}"
            f"{c['disk_bytes'] / gb:>9.2f}"
            f"{led['rows']:>10}{led['csv_bytes'] / 1e6:>8.2f}{led['train_log_bytes'] / 1e6:>8.2f}"
            f"{led['memory_bytes_per_rank'] / 1e6:>10.2f}"
            f"{led['per_collective_rows']:>12}{led['per_collective_bytes'] / gb:>10.2f}"
        )
    print(
        "GPU GB: model + optimizer per GPU at its peak phase (no activations); ckpt/disk: one "
        "checkpoint at its largest phase / keep_checkpoints of them (one replica per distinct "
        "state: one before the first factorisation, one per A/B group after); ledger MB: "
        "a rank's ledger in memory (the steps since a checkpoint); coll.: "
        "per-collective ledger rows, if switched on (tracking.ledger_rows)"
    )


if __name__ == "__main__":
    sys.exit(main())
