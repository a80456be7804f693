#!/usr/bin/env bash
# The test command: set up, lint, run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# Two workers (pytest-xdist) on the two cores, which they keep busy: three made the run
# slower (44m52s against 39m10s on a clean clone, docs/testing.md). Each test file stays on
# one worker (its module fixtures built once), the longest files first (tests/conftest.py).
# A worker that dies (a crash in native code) ends the run naming the test it ran: under
# --dist loadfile pytest-xdist's replacement worker can wait for work for ever
# (pytest-xdist issues #784, #1323; seen here once, in the fast tier).
.venv/bin/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --max-worker-restart=0 \
  --durations=25 "$@"
