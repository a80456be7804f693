#!/usr/bin/env bash
# The main job: set up, prepare the data, then `ddp` and `ab` on 4 ranks as 2 nodes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m abtrain prepare --config params.yaml
for method in ddp ab; do
  .venv/bin/python -m abtrain.launch --nnodes 2 --nproc-per-node 2 \
    train --config params.yaml --set method=$method --out runs/main/$method
done
.venv/bin/python -m abtrain compare runs/main/ddp runs/main/ab
