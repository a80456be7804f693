"""The emulated cluster's mechanics (not its timings): namespaces, shaped links, counters."""

import os
import shutil
import subprocess

import pytest

from bench import cluster, network, study
from tests.helpers import PARAMS, ROOT, TINY

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None,
    reason="network namespaces need root and iproute2",
)


def measure(tmp_path, method: str, rate: str | None, sets: list[str]) -> dict:
    """One run of the benchmark, trained as its plan launches it, and its per-rate row."""
    bench = network.Network(
        out=tmp_path / "results",
        config=str(PARAMS),
        shapes=[(2, 2, [rate])],
        methods=[method],
        sets=sets,
        work=tmp_path,
        timeout=300,
    )
    (run,) = bench.runs()
    study.launch(run)
    assert bench.found(run) == str(run.folder)
    return bench.result(run)


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


@pytest.mark.multiprocess
def test_two_nodes_at_a_low_rate_finish_and_counters_agree_with_the_ledger(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    sets = [o for o in TINY if not o.startswith(("model=", "steps="))] + [
        "steps=12",
        "checkpoint_every=0",
        "model={name: mlp, width: 256, depth: 3, init: default}",
    ]
    r = measure(tmp_path, "ddp", "100mbit", sets)
    assert r["steps"] == 12 and r["evals"]
    for node in (0, 1):
        ledger = r["ledger_inter_node_bytes_by_node"][node]
        tx = r["interface_bytes_by_node"][node]["tx"]
        assert ledger > 1_000_000
        # headers, acknowledgements, gloo's framing and the rendezvous ride on top
        assert 0 <= tx / ledger - 1 < 0.15, (tx, ledger)
    assert cluster.leftover_namespaces() == []
    assert not subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True).stdout


@pytest.mark.multiprocess
def test_ab_syncs_cross_each_node_boundary_as_often_as_the_ledger_says(tmp_path, monkeypatch):
    """Mostly syncs: each factor broadcast to every rank. Over the world in one gloo call
    (a binomial tree) it crossed twice on 2 x 2 where the ledger counted once."""
    monkeypatch.chdir(ROOT)
    sets = [o for o in TINY if not o.startswith(("model=", "steps=", "ab."))] + [
        "steps=16",
        "checkpoint_every=0",
        "model={name: mlp, width: 256, depth: 3, init: default}",
        "ab.warmup_steps=1",
        "ab.ab_steps=2",
        "ab.rebound_steps=1",
        "ab.lr_rebound_steps=1",
        "ab.sync_mode=only_learned",
    ]
    stale = tmp_path / "ab-2x2-unshaped"  # an earlier benchmark's finished run: not resumed
    stale.mkdir()
    (stale / "summary.json").write_text("{}")
    r = measure(tmp_path, "ab", None, sets)
    syncs = r["traffic"]["by_phase"]["sync"]["inter"]
    assert syncs > 0.3 * r["traffic"]["inter_node_bytes"]  # a large share
    for node in (0, 1):
        ledger = r["ledger_inter_node_bytes_by_node"][node]
        tx = r["interface_bytes_by_node"][node]["tx"]
        assert 0 <= tx / ledger - 1 < 0.15, (node, tx, ledger, tx / ledger)
    assert cluster.leftover_namespaces() == []
