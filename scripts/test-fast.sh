#!/usr/bin/env bash
# The fast tier: set up, lint, then every test but the kinds that take minutes: those marked
# multiprocess (torchrun, gloo ranks, mpirun), cluster (the local Slurm cluster), browser
# (Chromium), pipeline (DVC, the pipeline's stages) and slow (pyproject.toml says which is
# which). About a minute and a half on 2 cores, on two pytest-xdist workers as the full run. `bash scripts/test.sh` runs every test (what CI runs).
# Arguments go to pytest, e.g. `bash scripts/test-fast.sh tests/abtrain -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# --max-worker-restart=0: as scripts/test.sh, a worker that dies ends the run naming its test
.venv/bin/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --max-worker-restart=0 \
  -m "not (multiprocess or cluster or browser or pipeline or slow)" "$@"
