#!/usr/bin/env bash
# The main job: set up, then the same short run with `ddp` and `ab` on 4 ranks as 2 nodes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
for method in ddp ab; do
  .venv/bin/python -m abtrain.launch --nnodes 2 --nproc-per-node 2 \
    train --config params.yaml --set method=$method --out runs/demo/$method
done
.venv/bin/python -m abtrain compare runs/demo/ddp runs/demo/ab
