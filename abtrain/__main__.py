"""`python -m abtrain train --config FILE [--set key=value ...] --out DIR` (under torchrun);
`check`, `prepare`, `compare`, `ui` (MLflow's web UI over the tracking store), `close` (a run
stopped for its store, ended in MLflow), and `plan`
(which method pays off on a given cluster and link, predicted without training)."""

from __future__ import annotations

import os
import signal
import sys

from abtrain.commands import compare
from abtrain.commands.check import run_check
from abtrain.commands.cli import build_parser
from abtrain.commands.preflight import check_batch, refuse_model
from abtrain.config import ConfigError, load, one_line
from abtrain.lifetime import die_with_parent

# abtrain.method.methods, .trainer and the data modules import torch: the commands that need them
# import them where they do, so that `--help` and `compare` don't load torch.


def main(argv: list[str] | None = None) -> int:
    """The command; a reader that closes the pipe early (`abtrain check | head -1`) ends it
    quietly, as `head` meant, instead of with a BrokenPipeError traceback."""
    try:
        return command(argv)
    except BrokenPipeError:
        # Python flushes stdout again at exit: point it at /dev/null first
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def command(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "compare":
        return compare.run(args.runs)
    if args.command == "plan":
        from abtrain.commands import plan  # the time model: torch

        return plan.run(args)
    if args.command == "close":  # MLflow's client, not torch
        return _close(args.out)

    from abtrain.method.methods import check_world

    try:
        if args.command == "ui":
            from abtrain.commands import ui

            return ui.run(ui.store_of(args), args.port, args.host)
        cfg = load(args.config, args.overrides)
        if args.command == "prepare":
            return _prepare(cfg)
        if args.command == "check":
            return run_check(cfg, args.config, args.world_size, args.ranks_per_node, args.layers)
        from abtrain.distributed.process import Launch

        if "TORCHELASTIC_RUN_ID" in os.environ:  # under torchrun: go when it goes
            die_with_parent(signal.SIGKILL)
        launch = Launch.from_env()
        check_world(cfg, launch.world_size, launch.ranks_per_node)
        check_batch(cfg, launch.world_size)
        refuse_model(cfg)  # before any process group exists
    except ConfigError as err:
        print(f"error: {in_use(one_line(err), args.config)}", file=sys.stderr)
        return 2
    return _train(cfg, args.out, launch, args.config)


def _close(out: str) -> int:
    from pathlib import Path

    from abtrain.files import RecordError
    from abtrain.tracking.tracker import TrackingError, close_stopped

    try:
        print(f"[abtrain] {close_stopped(Path(out))}", flush=True)
    except (TrackingError, RecordError) as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 1
    return 0


def in_use(message: str, config: str) -> str:
    """A hint to run a command with `--config FILE` (written where the file is not known)
    names the file this command read."""
    return message.replace("--config FILE", f"--config {config}").replace(
        "--config ...", f"--config {config}"
    )


def _train(cfg, out: str, launch, config: str) -> int:
    import torch.distributed as dist

    from abtrain.run.trainer import StopForRequeue, Trainer
    from abtrain.tracking.tracker import TrackingLost

    try:
        summary = Trainer(cfg, out, launch).run()
    except StopForRequeue as err:
        if launch.rank == 0:
            print(f"[abtrain] {err}", flush=True)
        return 0  # not a failure: DIR/REQUEUE tells the batch script to requeue the job
    except TrackingLost as err:  # every rank stopped at the same checkpoint: one line
        if launch.rank == 0:
            print(f"[abtrain] error: {err}", file=sys.stderr, flush=True)
        return 3
    except Exception as err:
        # Name this rank: with several ranks failing together, the first line tells which
        # one saw what (a peer that died shows up as a closed connection or a timeout).
        print(
            f"[abtrain] rank {launch.rank} (node {launch.node}) failed: {type(err).__name__}: "
            f"{in_use(str(err), config)}",
            file=sys.stderr,
            flush=True,
        )
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if launch.rank == 0:
        print(f"[abtrain] {done_line(summary, out)}", flush=True)
    return 0


def done_line(summary: dict, out: str) -> str:
    """A finished run in one line: its best val top-1 and where (the first evaluation that
    reached it), the final one, and the inter-node bytes each rank sent."""
    top1, t = summary["val_top1"], summary["traffic"]
    at = next(e["step"] for e in summary["evals"] if e["val_top1"] == top1["best"])
    return (
        f"done: best val top1 {top1['best']:.2f}% (step {at}), final {top1['final']:.2f}%, "
        f"inter-node {t['inter_node_bytes'] / 1e6:.2f} MB/rank, "
        f"summary in {os.path.join(out, 'summary.json')}"
    )


def _prepare(cfg) -> int:
    from abtrain.data.prepare import prepare
    from abtrain.data.sources import DataError

    if cfg.data.name == "synthetic":
        print("data.name is synthetic: nothing to prepare")
        return 0
    try:
        meta = prepare(cfg.data)
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for split, counts in meta["counts"].items():
        print(
            f"{split}: {sum(counts.values())} images in {len(counts)} classes "
            f"({min(counts.values())}-{max(counts.values())} per class)"
        )
    print(f"prepared in {cfg.data.prepared} ({'tensor cache' if meta['cached'] else 'file index'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
