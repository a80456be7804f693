#!/usr/bin/env bash
# The test command: set up, lint, run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# Three workers (pytest-xdist) on two cores: two left the cores idle for a quarter of the
# run while the tests waited on processes, DVC, Slurm, servers and timeouts (docs/testing.md);
# each test file stays on one worker (its module fixtures built once), the longest files
# first (tests/conftest.py).
.venv/bin/python -m pytest -q -n 3 --dist loadfile --no-loadscope-reorder --durations=25 "$@"
