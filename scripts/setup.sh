#!/usr/bin/env bash
# Create .venv from the lock file (once; again when the lock changes).
set -euo pipefail
cd "$(dirname "$0")/.."
stamp=.venv/.lock-sha256
want=$(sha256sum requirements.lock | cut -d' ' -f1)
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  python3 -m venv .venv
  # This machine's pip configuration names local package folders that lack some packages;
  # pip warns once per package and folder (hundreds of lines), which says nothing here.
  .venv/bin/pip install --quiet --disable-pip-version-check -r requirements.lock \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
  .venv/bin/pip check
  echo "$want" > "$stamp"
fi
# `import abtrain` from anywhere in the environment (examples/, a user's own script), the
# checkout itself on the path: edits take effect without reinstalling
.venv/bin/python -c 'import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()["purelib"], "abtrain-checkout.pth").write_text(str(pathlib.Path.cwd()) + "\n")'
# `dvc plots show`'s page template, with Vega inlined (.dvc/config names it): offline as ever
.venv/bin/python -m pipeline.plots --template > /dev/null
