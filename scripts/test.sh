#!/usr/bin/env bash
# The test command: set up, lint, run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# Two workers (pytest-xdist): the tests wait on processes, DVC, Slurm and servers for a
# quarter of their time, so two share the two cores; each test file stays on one worker
# (its module fixtures built once), the longest files first (tests/conftest.py).
.venv/bin/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=25 "$@"
