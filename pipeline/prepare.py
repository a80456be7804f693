"""Stage `prepare`: verify every data set the experiments need and write its prepared form
(under data/prepared/)."""

from __future__ import annotations

import sys

from abtrain.prepare import prepare
from abtrain.sources import DataError
from pipeline.common import data_configs, params, stage


def main() -> int:
    for data in data_configs(params()):
        try:
            meta = prepare(data)
        except DataError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        n = {split: sum(c.values()) for split, c in meta["counts"].items()}
        print(
            f"[pipeline] {data.name}: {n['train']} train / {n['val']} val images in {data.prepared}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(stage(main))
