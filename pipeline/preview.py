"""`python -m pipeline.preview -S KEY=VALUE ...`: what `dvc exp run -S KEY=VALUE ...` would
change and run, without running anything or changing params.yaml.

`dvc exp run --dry` can't tell: it prepares an experiment in a temporary copy of the
repository, which lacks the prepared data (untracked), and fails on the first stage whose
input that is. This reads the same things DVC would: params.yaml rewritten by DVC's own
code for `-S` (on a copy), the params each stage of dvc.yaml tracks, `dvc status` for what
is out of date already, and, for the runs of the matrix, their values as the resolve stage
would write them (results/resolved/NAME.json), so a key every run takes from elsewhere
(the search's best) is shown to retrain nothing. Then every stage downstream of those.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from abtrain.config import diff_keys
from pipeline.matrix import best_config, data_configs, runs
from pipeline.resolve import path_of, record, text
from pipeline.stage import PARAMS, covered, parser, stage


def rewritten(overrides: list[str]) -> str:
    """params.yaml as `dvc exp run -S` would leave it (DVC's own code, on a copy)."""
    from dvc.utils.hydra import apply_overrides

    with tempfile.TemporaryDirectory() as d:
        copy = Path(d) / "params.yaml"
        shutil.copy(PARAMS, copy)
        apply_overrides(str(copy), overrides)
        return copy.read_text()


def changed_lines(before: str, after: str) -> list[str]:
    return [
        line
        for line in difflib.unified_diff(before.splitlines(), after.splitlines(), n=0, lineterm="")
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]


def stale_now() -> set[str]:
    """The stages `dvc status` finds out of date before any change."""
    dvc = Path(sys.executable).with_name("dvc")
    cmd = [str(dvc) if dvc.exists() else "dvc", "status", "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ})
    try:
        return set(json.loads(done.stdout or "{}"))
    except json.JSONDecodeError:
        return set()


def affected(old: dict[str, Any], new: dict[str, Any]) -> tuple[set[str], list[str]]:
    """The stages the change reaches (their tracked params, or for a run its resolved
    values, and every stage downstream), and every stage in dvc.yaml's order (in which each
    follows what it depends on)."""
    import networkx as nx
    from dvc.repo import Repo

    changed = diff_keys(old, new)
    index = Repo(".").index
    graph, order = index.graph, [s.addressing for s in index.stages]
    hit = set()
    for st in graph.nodes:
        if st.addressing.startswith("train@"):
            continue  # decided by its resolved values, below
        tracked = [k for d in st.deps if hasattr(d, "params") for k in (d.params or [])]
        if any(covered(c, tracked) or covered(t, changed) for c in changed for t in tracked):
            hit.add(st.addressing)
    best = best_config(new)
    for name, run in runs(new).items():
        path = path_of(name)
        if not path.exists() or path.read_text() != text(record(new, run, best)):
            hit.add(f"train@{name}")
    # two stages' outputs are known without running them: resolve's, computed run by run
    # above, and prepare's, the same data while the data sets' configs are the same
    same_data = [d.model_dump() for d in data_configs(old)] == [
        d.model_dump() for d in data_configs(new)
    ]
    quiet = {"resolve"} | ({"prepare"} if same_data else set())
    downstream = set(hit)
    for st in graph.nodes:
        if st.addressing in hit and st.addressing not in quiet:
            downstream |= {a.addressing for a in nx.ancestors(graph, st)}
    return downstream, order


def main(overrides: list[str]) -> int:
    before = PARAMS.read_text()
    after = rewritten(overrides)
    old, new = yaml.safe_load(before), yaml.safe_load(after)
    print(f"[preview] params.yaml after -S {' -S '.join(overrides)} (as DVC rewrites it):")
    for line in changed_lines(before, after) or ["  (no change)"]:
        print(f"  {line}")
    hit, order = affected(old, new)
    stale = stale_now()
    reached = [s for s in order if s in hit]
    runs_hit = [s.removeprefix("train@") for s in reached if s.startswith("train@")]
    print(
        f"[preview] the change reaches: {', '.join(reached) or 'no stage'}; runs it retrains: "
        f"{', '.join(runs_hit) or 'none (no run trains with other values)'}"
    )
    print(
        f"[preview] out of date already (dvc status): {', '.join(s for s in order if s in stale) or 'nothing'}"
    )
    run = [s for s in order if s in hit | stale]
    print(f"[preview] `dvc exp run` would run, in order: {', '.join(run) or 'nothing'}")
    return 0


if __name__ == "__main__":
    ap = parser("pipeline.preview", __doc__)
    ap.add_argument("-S", "--set-param", dest="sets", action="append", default=[],
                    metavar="KEY=VALUE", help="as `dvc exp run -S` takes it (repeatable)")  # fmt: skip
    sys.exit(stage(main, ap.parse_args().sets))
