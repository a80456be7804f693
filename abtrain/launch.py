"""`python -m abtrain.launch --nnodes N --nproc-per-node R ARGS`: `python -m abtrain ARGS`
on N "nodes" of this machine, one torchrun each (abtrain.commands.localrun), as a cluster would.
Its own bad arguments are one line and exit code 2, as the run's refusals are."""

from __future__ import annotations

import argparse
import signal
import sys
import typing

from abtrain.commands.localrun import run_local


class _OneLineParser(argparse.ArgumentParser):
    """argparse's error as one line and exit code 2, as the launcher's other refusals (not
    the usage text above it)."""

    def error(self, message: str) -> typing.NoReturn:
        print(f"error: {self.prog}: {message}", file=sys.stderr, flush=True)
        sys.exit(2)


def _count(least: int) -> typing.Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"{value} is below {least}")
        return value

    return parse


def main(argv: list[str] | None = None) -> int:
    parser = _OneLineParser(prog="python -m abtrain.launch")
    parser.add_argument("--nnodes", type=_count(1), default=1)
    parser.add_argument("--nproc-per-node", type=_count(1), default=1)
    parser.add_argument(
        "--max-restarts",
        type=_count(0),
        default=0,
        help="torchrun restarts every rank this many times after a failure; each restart "
        "resumes from the last checkpoint",
    )
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments of python -m abtrain")
    ns = parser.parse_args(argv)
    try:
        return run_local(ns.nnodes, ns.nproc_per_node, ns.args, max_restarts=ns.max_restarts)
    except KeyboardInterrupt:  # in its first seconds, importing torch to check the run: once
        # the nodes start, Ctrl-C stops them and says so (run_local)
        print("[abtrain.launch] stopped (Ctrl-C) before any node started", file=sys.stderr)
        return 128 + signal.SIGINT


if __name__ == "__main__":
    sys.exit(main())
