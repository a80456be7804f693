"""Benchmark on an emulated cluster: every method on the same model, data and seed, over
real links of a chosen speed; traffic counted at the interfaces and by the ledger.

    sudo-less as root here:
    python -m bench.network --nodes 2 --ranks-per-node 2 --rates 200mbit,none \\
        --methods ddp,ab,ab_nogroups,powersgd --set steps=150

Writes bench/results/network-<rate>.json and bench/results/network.png, and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from abtrain.checkpoint import atomic_write_text
from bench.cluster import Cluster

RESULTS = Path("bench/results")


def ledger_by_node(run_dir: Path, nodes: list[int]) -> dict[int, int]:
    """Inter-node bytes each node's ranks put on the wire, from the ledger."""
    out = {n: 0 for n in set(nodes)}
    for line in (run_dir / "ledger.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["inter_node"]:
            out[nodes[r["rank"]]] += r["wire_bytes"]
    return out


def run_one(method: str, rate: str | None, a: argparse.Namespace, work: Path) -> dict[str, Any]:
    out = work / f"{method}-{rate or 'unshaped'}"
    with Cluster(a.nodes, rate) as c:
        env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0", "PYTHONUNBUFFERED": "1"}
        before = [c.counters(i) for i in range(a.nodes)]
        sets = [
            x
            for s in [
                f"method={method}",
                "tracking.enabled=false",
                "tracking.ledger_rows=true",
                *a.set,
            ]
            for x in ("--set", s)
        ]
        start = time.time()
        procs = [
            c.start(
                i,
                [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    f"--nnodes={a.nodes}",
                    f"--nproc-per-node={a.ranks_per_node}",
                    f"--node-rank={i}",
                    f"--master-addr={c.address(0)}",
                    "--master-port=29400",
                    "-m",
                    "abtrain",
                    "train",
                    "--config",
                    a.config,
                    *sets,
                    "--out",
                    str(out),
                ],
                env,
                work / f"{out.name}-node{i}.log",
            )
            for i in range(a.nodes)
        ]
        codes = [p.wait(timeout=a.timeout) for p in procs]
        wall = time.time() - start
        after = [c.counters(i) for i in range(a.nodes)]
    if any(codes):
        raise RuntimeError(f"{method} at {rate}: exit codes {codes}; see {work}/*.log")
    s = json.loads((out / "summary.json").read_text())
    nodes = [r // a.ranks_per_node for r in range(s["world_size"])]
    ledger = ledger_by_node(out, nodes)
    iface = [{k: after[i][k] - before[i][k] for k in ("tx", "rx")} for i in range(a.nodes)]
    return dict(
        method=method,
        rate=rate or "unshaped",
        wall_seconds=wall,
        steps=s["steps"],
        val_top1=s["val_top1"],
        evals=s["evals"],
        compression_ratio=s["compression_ratio"],
        ledger_inter_node_bytes_by_node=ledger,
        interface_bytes_by_node=iface,
        ledger_vs_interface=[
            iface[i]["tx"] / ledger[i] - 1 if ledger[i] else None for i in range(a.nodes)
        ],
        traffic=s["traffic"],
        step_seconds=_step_times(out),
    )


def _step_times(out: Path) -> dict[str, float]:
    """Mean seconds per step by phase, from the run's log."""
    import csv

    rows = list(csv.DictReader((out / "train_log.csv").open()))
    by: dict[str, list[float]] = {}
    for r in rows:
        if "seconds" in r and r["seconds"]:
            by.setdefault(r["phase"], []).append(float(r["seconds"]))
    return {k: sum(v) / len(v) for k, v in by.items()}


def time_to(evals: list[dict[str, Any]], target: float) -> float | None:
    for e in evals:
        if e["val_top1"] >= target:
            return e["seconds"]
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.network")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--ranks-per-node", type=int, default=2)
    p.add_argument("--rates", default="200mbit,none", help="link rates; none: unshaped")
    p.add_argument("--methods", default="ddp,ab,ab_nogroups,powersgd")
    p.add_argument("--config", default="params.yaml")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--timeout", type=float, default=3600)
    a = p.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    work = Path("runs/bench")
    work.mkdir(parents=True, exist_ok=True)
    for rate in a.rates.split(","):
        rate = None if rate == "none" else rate
        results = [run_one(m, rate, a, work) for m in a.methods.split(",")]
        target = min(r["val_top1"]["best"] for r in results)
        for r in results:
            r["target_top1"], r["seconds_to_target"] = target, time_to(r["evals"], target)
        name = f"network-{rate or 'unshaped'}"
        atomic_write_text(
            RESULTS / f"{name}.json",
            json.dumps(
                dict(
                    nodes=a.nodes,
                    ranks_per_node=a.ranks_per_node,
                    rate=rate or "unshaped",
                    overrides=a.set,
                    results=results,
                ),
                indent=2,
            ),
        )
        print(f"\nrate {rate or 'unshaped'}: target top-1 {target:.2f}%")
        print(
            f"{'method':<12}{'top1':>7}{'to target s':>13}{'wall s':>8}"
            f"{'iface tx MB/node':>18}{'ledger MB/node':>16}{'diff':>7}"
        )
        for r in results:
            tx = sum(i["tx"] for i in r["interface_bytes_by_node"]) / a.nodes / 1e6
            led = sum(r["ledger_inter_node_bytes_by_node"].values()) / a.nodes / 1e6
            t = r["seconds_to_target"]
            print(
                f"{r['method']:<12}{r['val_top1']['final']:>7.2f}{t if t else float('nan'):>13.1f}"
                f"{r['wall_seconds']:>8.1f}{tx:>18.2f}{led:>16.2f}{tx / led - 1:>+7.1%}"
            )
    plot()
    return 0


def plot() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = sorted(RESULTS.glob("network-*.json"))
    if not files:
        return
    fig, axes = plt.subplots(1, len(files), figsize=(6 * len(files), 4), squeeze=False)
    for ax, f in zip(axes[0], files):
        d = json.loads(f.read_text())
        for r in d["results"]:
            ax.plot(
                [e["seconds"] for e in r["evals"]],
                [e["val_top1"] for e in r["evals"]],
                marker="o",
                label=r["method"],
            )
        ax.axhline(d["results"][0]["target_top1"], color="grey", ls=":", lw=1)
        ax.set(
            title=f"{d['nodes']} nodes x {d['ranks_per_node']} ranks, link {d['rate']}",
            xlabel="wall time (s)",
            ylabel="validation top-1 (%)",
        )
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "network.png", dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
