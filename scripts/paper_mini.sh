#!/usr/bin/env bash
# The paper's profile in miniature (docs/paper-profile.md: "The paper's profile in miniature"): set up, then
# `python -m pipeline.miniature`: generated data, the local SLURM cluster, `dvc repro`, report.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pipeline.miniature "$@"
