#!/usr/bin/env bash
# Does this tree train bit for bit as commit REV did? Seven short 2-node runs (each method
# on the tests' MLP; ab on ResNet-50 with the prepared CIFAR images and world-synced batch
# norm) with REV's code and with this tree's; their summaries (times aside), train logs,
# ledger.csv and model.pt must be identical. About 6 minutes on 2 cores.
# Usage: bash scripts/same-bits.sh REV   (run `dvc repro prepare` first for the image run)
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:?usage: bash scripts/same-bits.sh REV}
py=$PWD/.venv/bin/python
work=$(mktemp -d)
trap 'git worktree remove --force "$work/old" >/dev/null 2>&1 || true' EXIT
git worktree add --detach "$work/old" "$rev" >/dev/null
ln -s "$PWD/data" "$work/old/data"
tiny=(steps=40 batch_size=16 eval_every=10 checkpoint_every=10
  "model={name: mlp, width: 64, depth: 3, init: default}" optim.lr_warmup_steps=4
  ab.warmup_steps=8 ab.ab_steps=8 ab.rebound_steps=3 ab.lr_rebound_steps=4
  powersgd.start_iter=5 powersgd.rank=2 tracking.enabled=false tracking.ledger_rows=true)
synthetic="data={name: synthetic, features: 64, classes: 10, train_samples: 2000, val_samples: 400}"
# timm's resnet50: REV must know `name: timm` (issue 28 on). Before it this model was
# `{name: resnet50, dropout: 0.0, zero_init_last: true, init: default}` (torchvision's), with
# the same parameter names and, at one seed, the same initial weights
resnet=("model={name: timm, arch: resnet50, kwargs: {drop_rate: 0.0, zero_init_last: true}, init: default}"
  dist.sync_batchnorm=world steps=12 eval_every=6 checkpoint_every=6 ab.warmup_steps=4
  ab.ab_steps=4 ab.rebound_steps=2 batch_size=8)
runs=(ddp ab powersgd ab_powersgd ab_nogroups ab_individual ab-resnet)
for tree in old new; do
  repo=$PWD; [ "$tree" = old ] && repo=$work/old
  for run in "${runs[@]}"; do
    extra=("$synthetic" "method=${run%%-*}")
    [ "$run" = ab-resnet ] && extra=(method=ab "${resnet[@]}")
    sets=(); for o in "${tiny[@]}" "${extra[@]}"; do sets+=(--set "$o"); done
    (cd "$repo" && $py -m abtrain.launch --nnodes=2 --nproc-per-node=2 train \
      --config params.yaml --out "$work/$tree/$run" "${sets[@]}" > "$work/$tree-$run.log" 2>&1) ||
      { echo "$tree $run failed: $work/$tree-$run.log"; exit 1; }
  done
done
$py - "$work" "${runs[@]}" <<'PY'
import csv, json, sys
import torch
work, runs = sys.argv[1], sys.argv[2:]
def read(tree, run):
    d = f"{work}/{tree}/{run}"
    s = json.load(open(f"{d}/summary.json"))
    for k in ("wall_seconds", "time"):
        s.pop(k, None)
    for e in s["evals"]:
        e.pop("seconds", None)
    log = [r[:4] for r in csv.reader(open(f"{d}/train_log.csv"))]
    return s, log, open(f"{d}/ledger.csv").read(), torch.load(f"{d}/model.pt", weights_only=True)
bad = 0
for run in runs:
    a, b = read("old", run), read("new", run)
    model = a[3].keys() == b[3].keys() and all(torch.equal(a[3][k], b[3][k]) for k in a[3])
    same = dict(summary=a[0] == b[0], train_log=a[1] == b[1], ledger=a[2] == b[2], model=model)
    bad += not all(same.values())
    print(run, " ".join(f"{k}={'same' if v else 'DIFFERS'}" for k, v in same.items()))
sys.exit(1 if bad else 0)
PY
