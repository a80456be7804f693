#!/usr/bin/env bash
# The main job: set up, then the whole default pipeline (`dvc repro`) to reports/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH" DVC_NO_ANALYTICS=1
dvc repro
echo "report: reports/README.md"
