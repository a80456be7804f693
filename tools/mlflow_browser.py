"""MLflow's web UI for real, as a researcher's browser shows it: `mlflow server` over a store,
and headless Chromium driven over its DevTools protocol on a pipe (the standard library
only: no Playwright, no websocket package), which can say where on the screen a figure is.
Used by the docs' screenshot (scripts/mlflow_compare_png.py) and the UI's tests.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from abtrain.commands.ui import SERVER_ENV, server_command
from abtrain.commands.ui import stop as ui_stop

WINDOW = (1400, 900)  # a laptop's browser window: "the first screen"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",  # as root, in a container
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    # offline: nothing may wait on Google's services
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
# MLflow 3.17 opens its Assistant panel (350 px) the first time a browser visits a server on
# this machine and remembers once it was closed; the tests and the screenshot show the page
# as it is from the second visit on
ASSISTANT_SEEN = "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1"
# Starts a program with two pipe ends as its fds 3 and 4 (those of --remote-debugging-pipe):
# no preexec_fn, which is unsafe beside threads, and no shell (dash takes no fd above 9).
# (Both are first copied above 9, in case either is 3 or 4 already.)
_ON_FDS_3_AND_4 = (
    "import fcntl, os, sys; "
    "a, b = (fcntl.fcntl(int(fd), fcntl.F_DUPFD, 10) for fd in sys.argv[1:3]); "
    "os.dup2(a, 3); os.dup2(b, 4); os.execv(sys.argv[3], sys.argv[3:])"
)


class BrowserError(RuntimeError):
    pass


def mlflow_server(
    store_uri: str, port: int, artifacts: Path | None = None, timeout: float = 120
) -> subprocess.Popen:
    """A real `mlflow server` on 127.0.0.1:`port` over `store_uri`, in a session of its own
    (`stop` it, or os.killpg), returned once it answers /health."""
    server = subprocess.Popen(
        server_command(store_uri, port, artifacts=artifacts),
        env={**os.environ, **SERVER_ENV},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return server
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                stop(server)
                raise BrowserError(
                    f"mlflow server over {store_uri} on port {port} did not answer /health "
                    f"in {timeout:.0f} s"
                ) from None
            time.sleep(0.5)


def stop(server: subprocess.Popen) -> None:
    """Stop a server from `mlflow_server`, its workers with it (as `abtrain ui` does)."""
    ui_stop(server)


def chromium() -> str | None:
    """Debian's chromium (apt-get install chromium), or None."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


# Where each text sits on the screen: the innermost element showing exactly that text (a
# table cell, a heading, a paragraph; spaces normalised); null if none is rendered.
_FIND = """
(texts) => {
  const norm = (t) => t.replace(/\\s+/g, ' ').trim();
  const all = [...document.body.querySelectorAll('*')];
  return Object.fromEntries(texts.map((text) => {
    const hits = all.filter((el) => el.innerText !== undefined && norm(el.innerText) === text);
    const el = hits.find((h) => !hits.some((o) => o !== h && h.contains(o)));
    if (!el) return [text, null];
    const r = el.getBoundingClientRect();
    return [text, [r.x, r.y, r.width, r.height]];
  }));
}
"""
# The runs table (ag-grid) as shown: {run id, or "header": {column id: cell}}, each cell's
# text (its last text: a run name's, not its colour's) and where that text is; `whole`: not
# cut by its cell (an ellipsis), by the grid's scrolled area, nor by the window.
_RUNS_TABLE = """
(() => {
  const out = {};
  const cells = '.ag-header-cell[col-id], .ag-row[row-id] .ag-cell[col-id]';
  for (const cell of document.querySelectorAll(cells)) {
    const walk = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    let last = null;
    while (walk.nextNode()) if (walk.currentNode.textContent.trim()) last = walk.currentNode;
    if (!last) continue;
    const range = document.createRange();
    range.selectNodeContents(last);
    const t = range.getBoundingClientRect();
    let whole = t.left >= 0 && t.top >= 0 && t.right <= innerWidth && t.bottom <= innerHeight;
    for (let el = last.parentElement; el; el = el.parentElement) {  // the grid's too
      const b = el.getBoundingClientRect(), style = getComputedStyle(el);
      const clips = style.overflowX !== 'visible' || style.textOverflow === 'ellipsis';
      if (clips && (t.left < b.left - 0.5 || t.right > b.right + 0.5)) whole = false;
    }
    const row = cell.closest('.ag-row');
    const key = row ? row.getAttribute('row-id') : 'header';
    (out[key] = out[key] || {})[cell.getAttribute('col-id')] = {
      text: last.textContent.trim(), x: t.x, y: t.y, width: t.width, height: t.height, whole};
  }
  return out;
})()
"""
# The compare view's metric table (virtualised: the rows it has rendered): [name, y, [value
# per run]], a row's cells found by their height on the screen.
_COMPARE_METRICS = """
(() => {
  const cells = [...document.querySelectorAll('.ReactVirtualized__Grid__innerScrollContainer > div')];
  return cells.filter((c) => c.querySelector('a[title="Plot chart"]')).map((name) => {
    const top = name.getBoundingClientRect().top;
    const values = cells
      .filter((c) => c.parentElement !== name.parentElement)
      .filter((c) => Math.abs(c.getBoundingClientRect().top - top) < 1)
      .sort((a, b) => a.getBoundingClientRect().left - b.getBoundingClientRect().left);
    return [name.innerText.trim(), top, values.map((c) => c.innerText.trim())];
  });
})()
"""


class Browser:
    """Headless Chromium showing one page in a `WINDOW`-sized viewport; `open` a page, ask
    where its texts are (`find`), `screenshot` it. Use it in a `with` block."""

    def __init__(self, window: tuple[int, int] = WINDOW, timeout: float = 60) -> None:
        path = chromium()
        if path is None:
            raise BrowserError("chromium is not installed (apt-get install chromium)")
        self.window, self.timeout = window, timeout
        self._profile = tempfile.TemporaryDirectory(prefix="abtrain-chromium-")
        # --remote-debugging-pipe: Chromium reads commands on fd 3 and answers on fd 4
        to_chrome, self._to = os.pipe()
        self._from, from_chrome = os.pipe()
        flags = [*CHROMIUM_FLAGS, f"--user-data-dir={self._profile.name}"]
        flags += [f"--window-size={window[0]},{window[1]}", "--remote-debugging-pipe"]
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _ON_FDS_3_AND_4, str(to_chrome), str(from_chrome), path, *flags],
            pass_fds=(to_chrome, from_chrome),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        os.close(to_chrome)
        os.close(from_chrome)
        self._pending, self._id, self._session = b"", 0, None
        try:
            target = self._call("Target.createTarget", url="about:blank")["targetId"]
            attached = self._call("Target.attachToTarget", targetId=target, flatten=True)
            self._session = attached["sessionId"]
            width, height = window
            self._call(
                "Emulation.setDeviceMetricsOverride",
                width=width,
                height=height,
                deviceScaleFactor=1,
                mobile=False,
            )
            seen = f"try {{ localStorage.setItem('{ASSISTANT_SEEN}', 'true') }} catch (e) {{}}"
            self._call("Page.enable")  # else the script below never runs
            self._call("Page.addScriptToEvaluateOnNewDocument", source=seen)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
        self.proc.wait(timeout=30)
        for fd in (self._to, self._from):
            try:
                os.close(fd)
            except OSError:
                pass
        self._profile.cleanup()

    def _call(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command; its result (events that come before it are dropped)."""
        self._id += 1
        message: dict[str, Any] = dict(id=self._id, method=method, params=params)
        if self._session is not None:
            message["sessionId"] = self._session
        os.write(self._to, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            while b"\0" not in self._pending:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self._from], [], [], left)[0]:
                    raise BrowserError(f"chromium did not answer {method} in {self.timeout} s")
                chunk = os.read(self._from, 1 << 20)
                if not chunk:
                    raise BrowserError(f"chromium exited (code {self.proc.poll()}) at {method}")
                self._pending += chunk
            raw, self._pending = self._pending.split(b"\0", 1)
            answer = json.loads(raw)
            if answer.get("id") == self._id:
                if "error" in answer:
                    raise BrowserError(f"{method}: {answer['error'].get('message')}")
                return answer["result"]

    def evaluate(self, expression: str) -> Any:
        """A JavaScript expression's value in the page (JSON-able)."""
        result = self._call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression[:80]!r}: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def open(self, url: str, ready: str, timeout: float = 60) -> None:
        """Load `url` afresh and wait until the JavaScript expression `ready` is true (the
        page has rendered what it is looked at for)."""
        # from a blank page: a link within MLflow's app changes only the address's #part, and
        # what the page showed before could satisfy `ready`
        self._call("Page.navigate", url="about:blank")
        self._call("Page.navigate", url=url)
        deadline = time.monotonic() + timeout
        # (while it loads, document.body may still be null)
        ready = f"(() => {{ try {{ return !!({ready}) }} catch (e) {{ return false }} }})()"
        while not self.evaluate(ready):
            if time.monotonic() > deadline:
                raise BrowserError(f"{url}: not ready in {timeout:.0f} s ({ready})")
            time.sleep(0.25)
        time.sleep(0.5)  # the last layout pass

    def text(self) -> str:
        """The page's visible text."""
        return self.evaluate("document.body.innerText")

    def find(self, *texts: str) -> dict[str, tuple[float, float, float, float] | None]:
        """Where each text is on the screen: (x, y, width, height) in CSS pixels from the
        viewport's top left, of the innermost element showing exactly that text; None if
        none does."""
        found = self.evaluate(f"({_FIND})({json.dumps(list(texts))})")
        return {t: tuple(box) if box else None for t, box in found.items()}

    def runs_table(self) -> dict[str, dict[str, dict[str, Any]]]:
        """The experiment's runs table as shown: {run id, or "header": {column id: {text, x,
        y, width, height, whole}}}; column ids as MLflow names them (`attributes.`Run
        Name``, `metrics.`Top-1 best``); `whole`: the text shows entirely, in the window."""
        return self.evaluate(_RUNS_TABLE)

    def compare_metrics(self) -> list[tuple[str, float, list[str]]]:
        """The compare view's metric table, the rows it has rendered: (name, y on the page,
        the value shown for each run)."""
        return [tuple(row) for row in self.evaluate(_COMPARE_METRICS)]

    def screenshot(self, path: Path) -> None:
        """The viewport (the first screen) as a PNG."""
        data = self._call("Page.captureScreenshot", format="png")["data"]
        Path(path).write_bytes(base64.b64decode(data))
