"""`python -m pipeline.reproduce [--against REF]`: this checkout's results (a fresh clone's,
after `dvc repro`) against the committed ones (REF, HEAD by default), run by run.

Bytes, compression and steps must be equal. A top-1 (best and final) must be equal where
both runs record the same machine (`summary.json`'s `machine`: torch, MKL, the CPU kernels
torch dispatches to, threads, CPU), and within the tolerance elsewhere: half the smaller
seed spread (standard deviation of best top-1) of the committed seed study of the matrix's
runs (reports/seeds/seeds.json), since another CPU's kernels sum an SVD or a QR in another
order. Exit code 0 when every run passes, 1 otherwise; docs/reproduce.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from pipeline.matrix import runs
from pipeline.stage import params, parser, stage

RESULTS = Path("results")
SEED_STUDY = Path("reports/seeds/seeds.json")  # the matrix's ddp and ab runs at 3 seeds
# what decides a top-1 beyond the config: two runs with these equal compute the same bits
SAME_MACHINE = ("torch", "mkl", "cpu_capability", "forced", "threads", "cpu")


def committed(ref: str, path: Path) -> dict[str, Any] | None:
    """The file at `ref` (git), or None where it has none."""
    shown = subprocess.run(["git", "show", f"{ref}:{path}"], capture_output=True, text=True)
    return json.loads(shown.stdout) if shown.returncode == 0 else None


def tolerance(ref: str) -> tuple[float, str]:
    """Half the smaller seed spread of best top-1 in the committed seed study of the
    matrix's own runs (its ddp and ab runs at several seeds), and where it comes from."""
    study = committed(ref, SEED_STUDY)
    if study is None:
        raise SystemExit(f"{ref} holds no {SEED_STUDY} (python -m bench.seeds): no tolerance")
    spreads = [
        (s["best_top1"]["std"], run)
        for run, s in study["summary"]["methods"].items()
        if s["best_top1"]["n"] > 1
    ]
    sd, run = min(spreads)
    return sd / 2, f"half the smaller seed spread of {SEED_STUDY}: sd {sd:.2f}, {run}"


def compare(name: str, mine: dict[str, Any], theirs: dict[str, Any], tol: float) -> list[str]:
    """What differs beyond what is allowed, one line each; [] where the run reproduces."""
    wrong = []
    exact = {
        "inter-node bytes": lambda r: r["traffic"]["inter_node_bytes"],
        "compression": lambda r: r["compression_ratio"],
        "steps": lambda r: r["steps"],
    }
    for what, read in exact.items():
        if read(mine) != read(theirs):
            wrong.append(f"{name}: {what} {read(mine)} here, {read(theirs)} committed")
    same = same_machine(mine, theirs)
    for which in ("best", "final"):
        a, b = mine["val_top1"][which], theirs["val_top1"][which]
        allowed = 0.0 if same else tol
        if abs(a - b) > allowed + 1e-9:
            why = "the same machine: exact" if same else f"tolerance {tol:.2f}"
            wrong.append(f"{name}: {which} top-1 {a:.2f}% here, {b:.2f}% committed ({why})")
    return wrong


def same_machine(a: dict[str, Any], b: dict[str, Any]) -> bool:
    ma, mb = a.get("machine"), b.get("machine")
    return bool(ma and mb) and all(ma.get(k) == mb.get(k) for k in SAME_MACHINE)


def row(name: str, mine: dict[str, Any], theirs: dict[str, Any]) -> str:
    moved = mine["val_top1"]["best"] - theirs["val_top1"]["best"]
    kind = "same machine" if same_machine(mine, theirs) else "another machine"
    return (
        f"{name:<18} bytes {'=' if mine['traffic'] == theirs['traffic'] else '≠'}  "
        f"best top-1 {theirs['val_top1']['best']:6.2f} -> {mine['val_top1']['best']:6.2f} "
        f"({moved:+.2f})  {kind}"
    )


def main(ref: str) -> int:
    tol, basis = tolerance(ref)
    print(f"[pipeline] against {ref}; top-1 on another machine: within {tol:.2f} ({basis})")
    failed = []
    for name in runs(params()):
        path = RESULTS / f"{name}.json"
        theirs = committed(ref, path)
        if theirs is None or not path.exists():
            failed.append(
                f"{name}: {'not committed at ' + ref if theirs is None else 'no ' + str(path) + ' here (run dvc repro)'}"
            )
            continue
        mine = json.loads(path.read_text())
        print(row(name, mine, theirs))
        failed += compare(name, mine, theirs, tol)
    for line in failed:
        print(f"[pipeline] differs: {line}", file=sys.stderr)
    if failed:
        return 1
    print("[pipeline] every run reproduces: bytes and compression exactly, top-1 as allowed")
    return 0


if __name__ == "__main__":
    ap = parser("pipeline.reproduce", __doc__)
    ap.add_argument("--against", default="HEAD", help="the commit to compare with (HEAD)")
    sys.exit(stage(main, ap.parse_args().against))
