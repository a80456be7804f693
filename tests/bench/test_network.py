"""The emulated cluster's mechanics (not its timings): namespaces, shaped links, counters."""

import argparse
import os
import shutil
import subprocess

import pytest

from bench import cluster, network
from tests.conftest import PARAMS, ROOT, TINY

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None,
    reason="network namespaces need root and iproute2",
)


def test_burst_is_never_below_the_mtu_limits():
    assert cluster.tbf_burst("200mbit") == str(50_000)
    assert cluster.tbf_burst("10mbit") == str(32 * 1024)
    with pytest.raises(ValueError, match="use e.g. 200mbit"):
        cluster.tbf_burst("fast")


def test_teardown_leaves_no_namespace_even_after_a_failure():
    with pytest.raises(RuntimeError, match="boom"):
        with cluster.Cluster(2, "100mbit") as c:
            assert len(c.names) == 2
            raise RuntimeError("boom")
    assert cluster.leftover_namespaces() == []


def test_two_nodes_at_a_low_rate_finish_and_counters_agree_with_the_ledger(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    sets = [o for o in TINY if not o.startswith(("model=", "steps="))] + [
        "steps=12",
        "checkpoint_every=0",
        "model={name: mlp, width: 256, depth: 3, init: default}",
    ]
    a = argparse.Namespace(nodes=2, ranks_per_node=2, config=str(PARAMS), set=sets, timeout=300)
    r = network.run_one("ddp", "100mbit", a, tmp_path)
    assert r["steps"] == 12 and r["evals"]
    for node in (0, 1):
        ledger = r["ledger_inter_node_bytes_by_node"][node]
        tx = r["interface_bytes_by_node"][node]["tx"]
        assert ledger > 1_000_000
        # headers, acknowledgements, gloo's framing and the rendezvous ride on top
        assert 0 <= tx / ledger - 1 < 0.15, (tx, ledger)
    assert cluster.leftover_namespaces() == []
    assert not subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True).stdout
