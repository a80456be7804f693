"""What serving a factorised layer's weight to outside readers costs (abtrain.method.lowrank.
LowRankLayer: `layer.weight` is A·B while the layer is factorised).

    python -m bench.weight_reads   # writes bench/results/weight_reads.json, prints a table

One process, no collectives: a 512-wide Linear factorised at rank 64, a training step
(forward, backward) of a batch of 64 through it, alone and with one outside read of its
`.weight` per step (`F.linear(x, layer.weight)`, as a tied decoder would); and the time of
one `.weight` read, of a plain nn.Linear, of a LowRankLayer at full rank and factorised.
Medians over `--repeats` rounds.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from abtrain.files import write_record
from abtrain.method import lowrank

OUT = Path("bench/results/weight_reads.json")


def timed(fn, n: int, repeats: int) -> float:
    """Median seconds of one call of `fn` over `repeats` rounds of `n` calls."""
    fn()
    rounds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        rounds.append((time.perf_counter() - t0) / n)
    return statistics.median(rounds)


def measure(width: int, rank: int, batch: int, repeats: int) -> dict[str, float]:
    torch.manual_seed(0)
    plain = nn.Linear(width, width)
    layer = lowrank.LowRankLayer(nn.Linear(width, width))
    full = {"full rank": timed(lambda: layer.weight, 10_000, repeats)}
    a, b = lowrank.factorize(layer.w.detach(), 1e-9, rank=rank)
    layer.set_factors(a, b, "a")
    x = torch.randn(batch, width)

    def step(outside: bool) -> None:
        y = layer(x)
        if outside:
            y = y + F.linear(x, layer.weight)
        y.square().mean().backward()

    return {
        "read_seconds_plain_linear": timed(lambda: plain.weight, 10_000, repeats),
        "read_seconds_lowrank_full_rank": full["full rank"],
        "read_seconds_lowrank_factorised": timed(lambda: layer.weight, 1_000, repeats),
        "step_seconds_no_outside_read": timed(lambda: step(False), 50, repeats),
        "step_seconds_one_outside_read": timed(lambda: step(True), 50, repeats),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.weight_reads", description=__doc__)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--rank", type=int, default=64)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    result = dict(
        width=a.width,
        rank=a.rank,
        batch=a.batch,
        threads=1,
        **measure(a.width, a.rank, a.batch, a.repeats),
    )
    for key, value in result.items():
        shown = f"{value * 1e6:.2f} µs" if key.endswith("seconds") or "_seconds_" in key else value
        print(f"{key:36} {shown}")
    write_record(a.out, result, end="\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
