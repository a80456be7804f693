#!/usr/bin/env bash
# The test command: set up, lint, run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# Two workers (pytest-xdist): the tests wait on processes, DVC, Slurm and servers for a
# quarter of their time, so two share the two cores; each test file stays on one worker
# (tests/conftest.py groups them), the longest first.
.venv/bin/python -m pytest -q -n 2 --dist loadgroup --durations=25 "$@"
