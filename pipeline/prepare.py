"""Stage `prepare`: verify every data set the experiments need and write its prepared form
(under data/prepared/), and each one's image counts in results/data/counts.json (committed: the
matrix's step counts follow from them, so a clone without the data, a planner or a test,
resolves every run as the pipeline does)."""

from __future__ import annotations

import sys

from abtrain.data.prepare import prepare
from abtrain.data.sources import DataError
from abtrain.files import write_record
from pipeline.matrix import data_configs
from pipeline.stage import DATA_COUNTS, params, parser, stage


def main() -> int:
    counts = {}
    for data in data_configs(params()):
        try:
            meta = prepare(data)
        except DataError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        n = {split: sum(c.values()) for split, c in meta["counts"].items()}
        counts[data.prepared] = dict(n, classes=len(meta["classes"]))
        print(
            f"[pipeline] {data.name}: {n['train']} train / {n['val']} val images in {data.prepared}"
        )
    DATA_COUNTS.parent.mkdir(parents=True, exist_ok=True)
    write_record(DATA_COUNTS, counts, sort_keys=True, end="\n")
    return 0


if __name__ == "__main__":
    parser("pipeline.prepare", __doc__).parse_args()
    sys.exit(stage(main))
