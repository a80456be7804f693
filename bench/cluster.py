"""N "nodes" as Linux network namespaces, joined by a bridge in a namespace of its own.

Each node's link is a veth pair (the node's end `eth0`, the switch's end `pN`), shaped with
a tbf qdisc in both directions (the node's egress and its switch port's egress), addressed
from a private range used only inside these namespaces. Several ranks on one node talk over
that node's loopback, standing in for NVLink. Everything is torn down on exit or failure,
killing only the processes started here.

    python -m bench.cluster --leftovers    # namespaces an earlier cluster left behind
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

SUBNET = "10.213.{}.{}"  # only ever inside these namespaces


def sh(*args: str) -> str:
    proc = subprocess.run(args, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def tbf_burst(rate: str) -> str:
    """A burst no smaller than max(32 KB, 2 MTU, 2 ms at the rate): smaller ones stall."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(k|m|g)bit", rate)
    if not m:
        raise ValueError(f"rate {rate!r}: use e.g. 200mbit or 1gbit")
    bits = float(m.group(1)) * {"k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
    return str(max(32 * 1024, 2 * 1500, int(bits / 8 * 0.002)))


class Cluster:
    def __init__(self, nodes: int, rate: str | None) -> None:
        self.nodes, self.rate = nodes, rate
        self.tag = uuid.uuid4().hex[:6]
        self.switch = f"abt-{self.tag}-sw"
        self.names = [f"abt-{self.tag}-n{i}" for i in range(nodes)]
        self.procs: list[subprocess.Popen] = []

    def address(self, node: int) -> str:
        return SUBNET.format(0, node + 1)

    def __enter__(self) -> Cluster:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build(self) -> None:
        sh("ip", "netns", "add", self.switch)
        sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.switch, "link", "set", "br0", "up")
        for i, ns in enumerate(self.names):
            sh("ip", "netns", "add", ns)
            sh(
                "ip",
                "link",
                "add",
                f"e{self.tag}{i}",
                "type",
                "veth",
                "peer",
                "name",
                f"p{self.tag}{i}",
            )
            sh("ip", "link", "set", f"e{self.tag}{i}", "netns", ns)
            sh("ip", "link", "set", f"p{self.tag}{i}", "netns", self.switch)
            sh("ip", "-n", ns, "link", "set", f"e{self.tag}{i}", "name", "eth0")
            sh("ip", "-n", self.switch, "link", "set", f"p{self.tag}{i}", "name", f"p{i}")
            sh("ip", "-n", ns, "addr", "add", f"{self.address(i)}/16", "dev", "eth0")
            for dev_ns, dev in ((ns, "eth0"), (ns, "lo"), (self.switch, f"p{i}")):
                sh("ip", "-n", dev_ns, "link", "set", dev, "up")
            sh("ip", "-n", self.switch, "link", "set", f"p{i}", "master", "br0")
            if self.rate:
                for dev_ns, dev in ((ns, "eth0"), (self.switch, f"p{i}")):
                    sh(
                        "tc",
                        "-n",
                        dev_ns,
                        "qdisc",
                        "add",
                        "dev",
                        dev,
                        "root",
                        "tbf",
                        "rate",
                        self.rate,
                        "burst",
                        tbf_burst(self.rate),
                        "latency",
                        "400ms",
                    )

    def counters(self, node: int) -> dict[str, int]:
        """Bytes sent and received on the node's link (its interface counters)."""
        base = "/sys/class/net/eth0/statistics"
        out = sh(
            "ip", "netns", "exec", self.names[node], "cat", f"{base}/tx_bytes", f"{base}/rx_bytes"
        ).split()
        return {"tx": int(out[0]), "rx": int(out[1])}

    def start(self, node: int, cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
        """Run `cmd` inside the node's namespace (its own process group, killed at close)."""
        f = open(log, "w")
        p = subprocess.Popen(
            ["ip", "netns", "exec", self.names[node], *cmd],
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(p)
        return p

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for ns in [*self.names, self.switch]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def leftover_namespaces() -> list[str]:
    return [
        line.split()[0]
        for line in sh("ip", "netns", "list").splitlines()
        if line.startswith("abt-")
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.cluster",
        description="Emulated cluster nodes as network namespaces (used by bench.network); "
        "this command only looks.",
    )
    p.add_argument(
        "--leftovers",
        action="store_true",
        help="list the abt-* namespaces still there (needs iproute2); none: nothing printed",
    )
    a = p.parse_args(argv)
    if not a.leftovers:
        p.print_help()
        return 0
    for name in leftover_namespaces():
        print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
