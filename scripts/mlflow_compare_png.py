"""docs/mlflow-compare.png: MLflow's runs table, "Key figures" view, of two short real runs.

    .venv/bin/python scripts/mlflow_compare_png.py [--work DIR] [--steps 48]

Trains ddp, then ab (2 nodes x 1 rank, the default profile's data, `--steps` steps) into a
fresh SQLite store in WORK (a new temporary folder unless given; runs already in a given
WORK are reused), serves it with `mlflow server`, and screenshots in headless Chromium, in
a 1400 x 900 window, the runs table in abtrain's "Key figures" view into docs/. Prints
where each run's key figures are on that screen, and fails if one is cut or off it. To check
by eye, it also saves the ab run's page (WORK/mlflow-run.png) and the compare view of both
(WORK/mlflow-compare-view.png, first screen). Needs Debian's chromium.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from abtrain.commands.localrun import free_port  # noqa: E402
from abtrain.files import atomic_write_bytes  # noqa: E402
from abtrain.tracking.views import HEADLINE, NOTE_START, key_figures_link  # noqa: E402
from tools.mlflow_browser import Browser, mlflow_server, stop  # noqa: E402

METHODS = ("ddp", "ab")  # ddp first: ab's "Bytes vs DDP" is against it


def train(work: Path, method: str, steps: int) -> None:
    """One short run of the default profile (its data, model and optimiser), tracked."""
    out = work / method
    if (out / "summary.json").exists():
        return
    sets = [
        f"method={method}",
        f"steps={steps}",
        f"eval_every={steps // 3}",
        "checkpoint_every=0",
        f"ab.warmup_steps={steps // 3}",
        f"ab.ab_steps={steps // 4}",
        f"ab.rebound_steps={steps // 12}",
        f"ab.lr_rebound_steps={steps // 12}",
        "data.workers=1",
        f"tracking.uri=sqlite:///{work / 'mlflow.db'}",
    ]
    cmd = [sys.executable, "-m", "abtrain.launch", "--nnodes=2", "--nproc-per-node=1"]
    cmd += ["train", "--config", str(ROOT / "params.yaml"), "--out", str(out)]
    cmd += sum((["--set", s] for s in sets), [])
    subprocess.run(cmd, cwd=ROOT, check=True)


def key_figures(browser: Browser, url: str, names: dict[str, str]) -> list[str]:
    """Each run's name and headline figures in the Key figures view: where they are, and
    what is wrong (cut, off the first screen, missing)."""
    rows = len(names)
    browser.open(
        url,
        f"document.querySelectorAll('.ag-center-cols-container .ag-row[row-id]').length >= {rows}"
        " && document.querySelector('.ag-header-cell[col-id*=\"Top-1 best\"]')",
    )
    table = browser.runs_table()
    problems = []
    for run_id, name in names.items():
        row = table.get(run_id, {})
        for col in ["attributes.`Run Name`", *(f"metrics.`{k}`" for k in HEADLINE)]:
            cell = row.get(col)
            if cell is None:
                problems.append(f"{name}: no {col}")
                continue
            where = f"x={cell['x']:.0f} y={cell['y']:.0f}"
            print(f"  {name:12s} {col:24s} {cell['text']:>12s} at {where}")
            if not cell["whole"]:
                problems.append(f"{name}: {col} is cut or off the first screen")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, help="default: a new temporary folder")
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "mlflow-compare.png")
    args = ap.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="abtrain-mlflow-"))
    work.mkdir(parents=True, exist_ok=True)
    for method in METHODS:
        train(work, method, args.steps)
    from mlflow.tracking import MlflowClient

    store = f"sqlite:///{work / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=store)
    exp = client.get_experiment_by_name("abtrain").experiment_id
    runs = {}
    for method in METHODS:  # each run's tags name its folder
        out = (work / method).resolve()
        (run,) = client.search_runs([exp], f"tags.out_dir = '{out}'", max_results=1)
        runs[method] = run
    port = free_port()
    server = mlflow_server(store, port)
    url = f"http://127.0.0.1:{port}/"
    try:
        with Browser() as browser:
            names = {r.info.run_id: r.info.run_name for r in runs.values()}
            print(f"the Key figures view ({'x'.join(map(str, browser.window))} window):")
            problems = key_figures(browser, url + key_figures_link(exp), names)
            shot = work / "mlflow-key-figures.png"
            browser.screenshot(shot)

            ab = runs["ab"].info.run_id
            browser.open(
                f"{url}#/experiments/{exp}/runs/{ab}?workflowType=machine_learning",
                f"document.body.innerText.includes({json.dumps(NOTE_START)})",
            )
            browser.screenshot(work / "mlflow-run.png")
            line = next(t for t in browser.text().splitlines() if t.startswith(NOTE_START))
            box = browser.find(line)[line]
            print(f"the ab run's page: {line!r} at y={box[1]:.0f}" if box else "")

            query = urllib.parse.urlencode(
                {"runs": json.dumps(list(names)), "experiments": json.dumps([exp])},
                quote_via=urllib.parse.quote,
            )
            browser.open(
                f"{url}#/compare-runs?{query}&workflowType=machine_learning",
                f"document.body.innerText.includes({json.dumps(HEADLINE[0])})",
            )
            browser.screenshot(work / "mlflow-compare-view.png")
            first = browser.compare_metrics()[0]
            print(f"the compare view's metric table: first row {first[0]!r} at y={first[1]:.0f}")
    finally:
        stop(server)
    if problems:
        raise SystemExit("not on the first screen: " + "; ".join(problems))
    atomic_write_bytes(args.out, shot.read_bytes())
    print(f"wrote {args.out}; for the eye: {work}/mlflow-run.png, mlflow-compare-view.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
