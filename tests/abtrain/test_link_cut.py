"""A link cut between two nodes, as it happens: two network namespaces joined by a bridge
(bench.cluster), the second node's switch port set down while the run is inside an AB
phase. The next collective that crosses the cut is the sync's average: both ranks end
within the timeout, each naming the collective, the phase and step, and the peer."""

import os
import re
import subprocess
import sys
import time

import pytest

from bench import cluster
from tests.helpers import PARAMS, ROOT, TINY

pytestmark = pytest.mark.multiprocess

TIMEOUT_S = 20


def test_a_cut_link_ends_both_nodes_naming_the_collective_and_the_peer(tmp_path, monkeypatch):
    if os.geteuid() != 0 or subprocess.run(["ip", "netns", "list"]).returncode:
        pytest.skip("network namespaces need root and iproute2")
    monkeypatch.chdir(ROOT)
    sets = [o for o in TINY if not o.startswith(("steps=", "ab."))] + [
        "steps=400",
        "checkpoint_every=0",
        "method=ab",
        "ab.warmup_steps=4",
        "ab.ab_steps=300",  # a long AB phase: no collective crosses the nodes in it
        "ab.rebound_steps=2",
        "ab.lr_rebound_steps=1",
        "ab.sync_mode=with_stale",  # the sync averages A and B over the world
        f"dist.timeout_s={TIMEOUT_S}",
    ]
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0", "PYTHONUNBUFFERED": "1"}
    out = tmp_path / "run"
    with cluster.Cluster(2, None) as c:
        procs, logs = [], []
        for node in range(2):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2"]
            cmd += ["--nproc-per-node=1", f"--node-rank={node}"]
            cmd += [f"--master-addr={c.address(0)}", "--master-port=29400"]
            cmd += ["-m", "abtrain", "train", "--config", str(PARAMS), "--out", str(out)]
            cmd += [x for s in sets for x in ("--set", s)]
            logs.append(tmp_path / f"node{node}.log")
            procs.append(c.start(node, cmd, env, logs[-1]))
        deadline = time.time() + 180
        while "enter ab phase" not in logs[0].read_text():
            assert time.time() < deadline, "no AB phase in 180 s:\n" + logs[0].read_text()
            assert all(p.poll() is None for p in procs), logs[0].read_text()
            time.sleep(0.2)
        cut = time.time()
        cluster.sh("ip", "-n", c.switch, "link", "set", "p1", "down")
        codes = [p.wait(timeout=TIMEOUT_S * 6) for p in procs]
        took = time.time() - cut
    assert all(codes), codes
    assert took < TIMEOUT_S * 5, took  # the AB phase's rest, then the timeout
    said = [log.read_text() for log in logs]
    for node, text in enumerate(said):
        line = next((ln for ln in text.splitlines() if "failed: CollectiveFailed" in ln), None)
        assert line is not None, text[-3000:]
        assert f"rank {node} (node {node})" in line
        assert re.search(r"all_reduce of \d+ bytes over ranks \[0, 1\] in the sync phase", line)
        other = 1 - node
        assert f"its peers on other nodes: rank {other} on node {other}" in line
