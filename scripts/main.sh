#!/usr/bin/env bash
# The main job: set up, then the whole default pipeline (`dvc repro`) to reports/; at the end,
# where the time went (set-up, each stage run).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH" DVC_NO_ANALYTICS=1
.venv/bin/python -m pipeline.main_job --setup-seconds $((SECONDS - start))
echo "report: reports/README.md"
