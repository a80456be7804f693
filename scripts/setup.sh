#!/usr/bin/env bash
# Create .venv from the lock file (once; again when the lock changes).
set -euo pipefail
cd "$(dirname "$0")/.."
stamp=.venv/.lock-sha256
want=$(sha256sum requirements.lock | cut -d' ' -f1)
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check -r requirements.lock
  .venv/bin/pip check
  echo "$want" > "$stamp"
fi
