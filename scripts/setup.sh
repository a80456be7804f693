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
  # The lock holds every package, so no resolver (`--no-deps`; `pip check` below), and two
  # pips at once on its two halves, each unzipping on a core of its own: torch, triton and
  # CUDA's wheels (4.5 GB unpacked), and the rest. pip would byte-compile what it installs
  # on one core; compileall does it on every core after (the same .pyc files; the few files
  # packages ship for other Pythons, such as torch's py312 tests, fail to compile, as pip
  # would skip them)
  big='^(nvidia-|triton==|torch==)'
  half() {
    .venv/bin/pip install --quiet --disable-pip-version-check --no-compile --no-deps \
      -r <(grep -v '^#' requirements.lock | grep "$@" -E "$big") \
      2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
  }
  half & first=$!
  half -v & second=$!
  wait "$first"
  wait "$second"
  site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  .venv/bin/python -m compileall -q -j 0 "$site" >/dev/null 2>&1 || true
  .venv/bin/pip check
  echo "$want" > "$stamp"
fi
# `import abtrain` from anywhere in the environment (examples/, a user's own script), the
# checkout itself on the path: edits take effect without reinstalling
.venv/bin/python -c 'import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()["purelib"], "abtrain-checkout.pth").write_text(str(pathlib.Path.cwd()) + "\n")'
# `dvc plots show`'s page template, with Vega inlined (.dvc/config names it): offline as ever
.venv/bin/python -m pipeline.plots --template > /dev/null
