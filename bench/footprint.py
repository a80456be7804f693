"""What a run keeps, measured: run-folder and checkpoint bytes per step, and a checkpoint
against one copy of model + AdamW state, for ddp and ab on 2 nodes × 2 ranks with one
gradient bucket per parameter (many collectives per step, as at scale).

    python -m bench.footprint    # writes bench/results/footprint.json, prints a table

Each method runs twice, for `--steps` and twice as many; the difference between the two
divided by the extra steps is what one step adds. Both end merged, with one replica; an ab
checkpoint also holds the factors A and B (and their AdamW moments) beside W, and their
size follows the ranks training keeps, which fall over a run, so its growth per step can
be negative and its size exceed one full-rank copy.
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from abtrain import config, models
from abtrain.files import write_record
from abtrain.run import checkpointer

RESULTS = Path("bench/results")
SETTINGS = [
    "batch_size=16",
    "eval_every=20",
    "checkpoint_every=20",
    "model={name: mlp, width: 64, depth: 8, init: default}",
    "data={name: synthetic, features: 64, classes: 10, train_samples: 2000, val_samples: 400}",
    "optim.lr_warmup_steps=4",
    "ab.warmup_steps=8",
    "ab.ab_steps=16",
    "ab.rebound_steps=4",
    "ab.lr_rebound_steps=4",
    "dist.bucket_cap_mb=0.001",
    "tracking.enabled=false",
    "tracking.ledger_rows=false",
]


def kept_bytes(run: Path) -> int:
    """Ledger, logs and summary: the run folder less checkpoints and final weights."""
    return sum(
        p.stat().st_size
        for p in run.rglob("*")
        if p.is_file() and "checkpoints" not in p.parts and p.name != "model.pt"
    )


def checkpoint_bytes(run: Path, step: int) -> int:
    return sum(p.stat().st_size for p in checkpointer.step_dir(run / "checkpoints", step).iterdir())


def one_copy_bytes(cfg: config.Config) -> int:
    model = models.build(cfg, cfg.data.classes, cfg.data.features)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, cfg.data.features)).sum().backward()
    opt.step()
    buf = io.BytesIO()
    torch.save(dict(model=model.state_dict(), optim=opt.state_dict()), buf)
    return len(buf.getvalue())


def train(out: Path, method: str, steps: int) -> None:
    cmd = [sys.executable, "-m", "abtrain.launch", "--nnodes=2", "--nproc-per-node=2"]
    cmd += ["train", "--config", "params.yaml", "--out", str(out)]
    for s in [*SETTINGS, f"method={method}", f"steps={steps}"]:
        cmd += ["--set", s]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{method} {steps} steps failed:\n{proc.stderr[-3000:]}")


def main() -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.footprint", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--out", default=str(RESULTS / "footprint.json"))
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for method in ("ddp", "ab"):
            short, long = Path(tmp, f"{method}-1"), Path(tmp, f"{method}-2")
            print(
                f"[footprint] {method}: {a.steps} and {2 * a.steps} steps on 2x2 ranks", flush=True
            )
            t0 = time.time()
            train(short, method, a.steps)
            train(long, method, 2 * a.steps)
            cfg = config.load(Path("params.yaml"), [*SETTINGS, f"method={method}"])
            buckets = sum(1 for _ in models.build(cfg, 10, 64).parameters())
            rows.append(
                dict(
                    method=method,
                    ranks=4,
                    buckets_per_step=buckets,
                    run_folder_bytes_per_step=(kept_bytes(long) - kept_bytes(short)) / a.steps,
                    checkpoint_growth_bytes_per_step=(
                        checkpoint_bytes(long, 2 * a.steps) - checkpoint_bytes(short, a.steps)
                    )
                    / a.steps,
                    checkpoint_bytes=checkpoint_bytes(long, 2 * a.steps),
                    one_copy_bytes=one_copy_bytes(cfg),
                    seconds=time.time() - t0,
                )
            )
            rows[-1]["checkpoint_vs_one_copy"] = (
                rows[-1]["checkpoint_bytes"] / rows[-1]["one_copy_bytes"]
            )
    print(f"{'method':<8}{'buckets':>8}{'run B/step':>12}{'ckpt B/step':>13}{'ckpt/copy':>11}")
    for r in rows:
        print(
            f"{r['method']:<8}{r['buckets_per_step']:>8}{r['run_folder_bytes_per_step']:>12.0f}"
            f"{r['checkpoint_growth_bytes_per_step']:>13.1f}{r['checkpoint_vs_one_copy']:>11.3f}"
        )
    result = dict(
        command="python -m bench.footprint " + " ".join(sys.argv[1:]),
        settings=SETTINGS,
        steps=[a.steps, 2 * a.steps],
        rows=rows,
    )
    write_record(a.out, result, end="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
