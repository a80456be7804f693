"""DVC plots that render offline: `dvc plots show` with an HTML template that carries
vega, vega-lite and vega-embed inline (DVC's default template loads them from a CDN).

The three libraries come from the npm registry (`npm pack`, once, into .cache/vega) and
are inlined into the template there; nothing of them is committed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

CACHE = Path(".cache/vega")
PACKAGES = {
    "vega@5": "build/vega.min.js",
    "vega-lite@5": "build/vega-lite.min.js",
    "vega-embed@6": "build/vega-embed.min.js",
}


def template() -> Path:
    out = CACHE / "template.html"
    if out.exists():
        return out
    if shutil.which("npm") is None:
        raise RuntimeError("npm is needed once to fetch vega for offline DVC plots")
    CACHE.mkdir(parents=True, exist_ok=True)
    scripts = []
    for spec, member in PACKAGES.items():
        name = (
            subprocess.run(
                ["npm", "pack", spec, "--silent"],
                cwd=CACHE,
                check=True,
                capture_output=True,
                text=True,
            )
            .stdout.strip()
            .splitlines()[-1]
        )
        with tarfile.open(CACHE / name) as tar:
            scripts.append(tar.extractfile(f"package/{member}").read().decode())
    body = "\n".join(f"<script>{s}</script>" for s in scripts)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(
        f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
        f"<title>abtrain plots</title>{body}</head>\n<body>\n{{plot_divs}}\n</body></html>\n"
    )
    tmp.replace(out)
    return out


def main() -> int:
    try:
        t = template()
    except (RuntimeError, subprocess.CalledProcessError) as err:
        print(f"[pipeline] offline plots skipped: {err}", file=sys.stderr)
        return 0
    return subprocess.run(
        ["dvc", "plots", "show", "--html-template", str(t), "-o", "reports/plots"]
    ).returncode


if __name__ == "__main__":
    sys.exit(main())
