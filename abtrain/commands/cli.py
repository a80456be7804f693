"""The command line of `python -m abtrain`: every command's arguments (train, check, prepare,
compare, ui, plan, close), in one parser that the commands, the launcher and a SLURM stage all read
(the launcher parses a `train` to refuse it before any torchrun). No command's code here:
building it imports nothing heavy, so `--help` stays quick."""

from __future__ import annotations

import argparse


def build_parser(kind: type[argparse.ArgumentParser] = argparse.ArgumentParser):
    """The command line of `python -m abtrain` (the launcher parses it too, with a `kind`
    that raises, before it starts any torchrun)."""
    parser = kind(prog="python -m abtrain")
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
    check.add_argument(
        "--layers",
        action="store_true",
        help="list the model's weight layers: which AB factorises, their shapes and sizes",
    )
    prep = sub.add_parser(
        "prepare", help="verify the config's data set and write its prepared form"
    )
    prep.add_argument("--config", required=True)
    prep.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    comp = sub.add_parser("compare", help="table of finished runs; traffic relative to ddp")
    comp.add_argument("runs", nargs="+", help="run folders holding summary.json")
    ui = sub.add_parser(
        "ui", help="MLflow's web UI over the config's tracking store; Ctrl-C stops it"
    )
    ui.add_argument("--config", default="params.yaml", help="its tracking.uri is the store")
    ui.add_argument("--store", help="a tracking URI (sqlite:///FILE), in place of --config's")
    ui.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ui.add_argument("--port", type=int, default=5000)
    ui.add_argument("--host", default="127.0.0.1", help="default: this machine only")
    close = sub.add_parser(
        "close",
        help="end the MLflow run of a run stopped for its tracking store (exit 3) once the "
        "store is back: send what it kept, mark it failed",
    )
    close.add_argument("out", help="the run folder (--out of the stopped run)")
    add_parser(sub)
    return parser


PLAN_ASSUMES = (
    "assumes every method needs the same number of steps to reach a given accuracy "
    "(bench.network measures how far that holds: bench/results/network-rates.json)"
)


PLAN_TO_TARGET = (
    "ranks by predicted time to the target top-1: the seconds each method's run in the file "
    "took to it, plus what the link adds to its steps and syncs before it (ToTarget, the "
    "time model bench.rates and the report use)"
)


PLAN_SCHEDULE = (
    "It plans with the settings the file's runs were made with (their schedule: the one "
    "their step times and steps to the target belong to); a --set that changes them "
    "leaves the time to the target out"
)


def add_parser(sub) -> None:
    plan = sub.add_parser(
        "plan",
        help="predict each method's time per step and run on a cluster and link; recommend one",
        description="Each method's expected seconds per step and for the run, and its "
        "inter-node bytes per rank, from the planner's time model: a step takes its compute "
        "time plus the time its node's inter-node bytes take over the link (no overlap). "
        "With a bench.network results file as --compute, which records how many steps each "
        "method took to a target top-1, the recommendation " + PLAN_TO_TARGET + "; a method "
        "that did not reach the target there is not recommended. " + PLAN_SCHEDULE + ". "
        "Otherwise it is the fastest predicted run, and it " + PLAN_ASSUMES + ".",
    )
    plan.add_argument("--config", required=True)
    plan.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one config value per --set (repeat it); with a bench.network file as "
        "--compute they apply over the settings of the file's runs",
    )
    plan.add_argument("--nodes", type=int, required=True)
    plan.add_argument("--ranks-per-node", type=int, required=True)
    plan.add_argument(
        "--link",
        required=True,
        help="one node's link, each direction: 200mbit, 1gbit, 25gbit, none (costs nothing), "
        "or bytes/s (25e9)",
    )
    source = plan.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--compute",
        metavar="FILE.json",
        help="per-method per-phase seconds per step without the network: "
        '{"ddp": {"full": 0.31}, "ab": {"warmup": 0.32, "ab": 0.35, "rebound": 0.41}}, '
        "or a bench.network results file (its step_seconds, and its steps to the target "
        "top-1; planned with the settings its runs were made with, each method with its "
        "own; take the unshaped one)",
    )
    source.add_argument(
        "--measure",
        action="store_true",
        help="time a few steps of each method on this machine at the requested shape "
        "(python -m abtrain.launch, all ranks on this machine, tracking off)",
    )
    plan.add_argument(
        "--methods", default=None, help="comma-separated (default: every method abtrain has)"
    )
    plan.add_argument(
        "--classes", type=int, default=None, help="default: from the config's data set"
    )
