"""The paper's scale on paper: predicted inter-node bytes per rank per step for the paper
profile's ViT-B/16 and ResNet-50 runs at 2-32 nodes, beside the paper's Table 1.

    python -m bench.planner    # writes bench/results/planner.json and prints a table

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
from abtrain.planner import plan
from pipeline.common import run_overrides, runs

IMAGENET_TRAIN = 1_281_167
PAPER = Path("profiles/paper.yaml")


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
    atomic_write_text(Path("bench/results/planner.json"), json.dumps(out, indent=2))
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
