"""`python -m abtrain train --config FILE [--set key=value ...] --out DIR` (under torchrun)."""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m abtrain")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train one run (launch with torchrun)")
    train.add_argument(
        "--config", required=True, help="YAML file; params.yaml is read from its `train` section"
    )
    train.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    train.add_argument("--out", required=True, help="run folder: summary, ledger, checkpoints")
    check = sub.add_parser("check", help="validate a config (and a world size) without training")
    check.add_argument("--config", required=True)
    check.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    check.add_argument(
        "--world-size", type=int, default=None, help="default: the fewest ranks the method runs on"
    )
    check.add_argument(
        "--ranks-per-node", type=int, default=None, help="default: all ranks on one node"
    )
    prep = sub.add_parser(
        "prepare", help="verify the config's data set and write its prepared form"
    )
    prep.add_argument("--config", required=True)
    prep.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    compare = sub.add_parser("compare", help="table of finished runs; traffic relative to ddp")
    compare.add_argument("runs", nargs="+", help="run folders holding summary.json")
    args = parser.parse_args(argv)
    if args.command == "compare":
        return _compare(args.runs)

    from abtrain.config import ConfigError, check_world, load

    try:
        cfg = load(args.config, args.overrides)
        if args.command == "prepare":
            return _prepare(cfg)
        if args.command == "check":
            return _check(cfg, args.config, args.world_size, args.ranks_per_node)
        from abtrain.trainer import Launch

        launch = Launch.from_env()
        check_world(cfg, launch.world_size, launch.ranks_per_node)
        check_batch(cfg, launch.world_size)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return _train(cfg, args.out, launch)


def smallest_world(cfg, ranks_per_node: int | None) -> tuple[int, int]:
    """(world size, ranks per node) of the fewest ranks `cfg` runs on: an AB method needs
    an A and a B group, of ab.group_size ranks or (group_size null) one node each."""
    from abtrain.config import AB_METHODS

    if cfg.method not in AB_METHODS or cfg.method == "ab_nogroups":
        return 1, 1
    if cfg.method == "ab_individual":
        return 2, ranks_per_node or 2
    if cfg.ab.group_size is None:
        return 2 * (ranks_per_node or 1), ranks_per_node or 1
    return 2 * cfg.ab.group_size, ranks_per_node or 2 * cfg.ab.group_size


def check_batch(cfg, world_size: int) -> list[str]:
    """Refuse a global batch larger than the training set; returns notes for the user."""
    from abtrain.config import ConfigError

    if cfg.data.name == "synthetic":
        n, origin = cfg.data.train_samples, "data.train_samples"
    else:
        from abtrain.data import train_size

        n, origin = train_size(cfg.data)
    if n is None:
        return [f"batch_size not checked against the training set: {origin} (run prepare)"]
    if cfg.batch_size * world_size > n:
        raise ConfigError(
            f"batch_size={cfg.batch_size} on {world_size} ranks is a global batch of "
            f"{cfg.batch_size * world_size}, more than the {n} training samples ({origin})"
        )
    return []


def _check(cfg, path: str, world_size: int | None, ranks_per_node: int | None) -> int:
    from abtrain.config import ConfigError, check_world

    notes = []
    if world_size is None:
        world_size, ranks_per_node = smallest_world(cfg, ranks_per_node)
        notes.append(
            f"no --world-size: checked on the fewest ranks {cfg.method} runs on, "
            f"{world_size // ranks_per_node} node(s) x {ranks_per_node}; "
            "pass --world-size N --ranks-per-node M to check a cluster"
        )
    elif ranks_per_node is None:
        ranks_per_node = world_size
        notes.append(f"no --ranks-per-node: checked as one node of {world_size} ranks")
    try:
        check_world(cfg, world_size, ranks_per_node)
    except ConfigError as err:
        raise ConfigError(f"{err} ({'; '.join(notes)})" if notes else str(err)) from None
    notes += check_batch(cfg, world_size)
    print(f"{path}: valid ({cfg.method}, {world_size} ranks)")
    for note in notes:
        print(f"note: {note}")
    return 0


def _train(cfg, out: str, launch) -> int:
    import torch.distributed as dist

    from abtrain.trainer import StopForRequeue, Trainer

    try:
        summary = Trainer(cfg, out, launch).run()
    except StopForRequeue as err:
        if launch.rank == 0:
            print(f"[abtrain] {err}", flush=True)
        return 0  # not a failure: DIR/REQUEUE tells the batch script to requeue the job
    except Exception as err:
        # Name this rank: with several ranks failing together, the first line tells which
        # one saw what (a peer that died shows up as a closed connection or a timeout).
        print(
            f"[abtrain] rank {launch.rank} (node {launch.node}) failed: {type(err).__name__}: {err}",
            file=sys.stderr,
            flush=True,
        )
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if launch.rank == 0:
        t = summary["traffic"]
        print(
            f"[abtrain] done: val top1 {summary['val_top1']['final']:.2f}%, "
            f"inter-node {t['inter_node_bytes'] / 1e6:.2f} MB/rank, "
            f"summary in {os.path.join(out, 'summary.json')}"
        )
    return 0


def _prepare(cfg) -> int:
    from abtrain.data import DataError, prepare

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


def _compare(runs: list[str]) -> int:
    import json
    from pathlib import Path

    rows = []
    for run in runs:
        path = Path(run) / "summary.json"
        if not path.exists():
            print(f"error: {path} does not exist (run not finished?)", file=sys.stderr)
            return 2
        rows.append(json.loads(path.read_text()))
    ddp = next((r for r in rows if r["method"] == "ddp"), None)
    print(
        f"{'method':<14}{'ranks':>6}{'nodes':>6}{'val top1':>10}{'compr.':>8}"
        f"{'inter-node MB/rank':>20}{'vs ddp':>8}{'wall s':>8}"
    )
    for r in rows:
        inter = r["traffic"]["inter_node_bytes"]
        ratio = f"{inter / ddp['traffic']['inter_node_bytes']:.3f}" if ddp else "-"
        print(
            f"{r['method']:<14}{r['world_size']:>6}{r['nodes']:>6}{r['val_top1']['final']:>9.2f}%"
            f"{r['compression_ratio']:>8.2f}{inter / 1e6:>20.2f}{ratio:>8}{r['wall_seconds']:>8.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
