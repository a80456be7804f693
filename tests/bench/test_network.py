"""The emulated cluster's mechanics (not its timings): namespaces, shaped links, counters."""

import argparse
import json
import os
import shutil
import subprocess

import pytest

from bench import cluster, network
from tests.helpers import PARAMS, ROOT, TINY

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


@pytest.mark.multiprocess
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
    a = argparse.Namespace(nodes=2, ranks_per_node=2, config=str(PARAMS), set=sets, timeout=300)
    stale = tmp_path / "ab-2x2-unshaped"  # an earlier benchmark's finished run: not resumed
    stale.mkdir()
    (stale / "summary.json").write_text("{}")
    r = network.run_one("ab", None, a, tmp_path)
    syncs = r["traffic"]["by_phase"]["sync"]["inter"]
    assert syncs > 0.3 * r["traffic"]["inter_node_bytes"]  # a large share
    for node in (0, 1):
        ledger = r["ledger_inter_node_bytes_by_node"][node]
        tx = r["interface_bytes_by_node"][node]["tx"]
        assert 0 <= tx / ledger - 1 < 0.15, (node, tx, ledger, tx / ledger)
    assert cluster.leftover_namespaces() == []


def test_each_run_is_announced_as_it_starts_and_finishes(tmp_path, monkeypatch, capsys):
    """The benchmark takes minutes per run: each one says which of how many, and the ETA."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(network, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(network, "plot", lambda results=None: None)
    monkeypatch.setattr(network, "summarise", lambda config, results=None: None)
    clock = iter(range(0, 10_000, 60))  # every look at the clock: a minute later
    monkeypatch.setattr(network.time, "monotonic", lambda: float(next(clock)))

    def fake_run(method, rate, a, work):
        evals = [{"step": 1, "seconds": 1.0, "val_top1": 30.0}]
        return dict(
            method=method,
            wall_seconds=60.0,
            val_top1={"best": 30.0, "final": 30.0},
            evals=evals,
            rate=rate,
            ledger_inter_node_bytes_by_node={0: 1},
            interface_bytes_by_node=[{"tx": 1}],
            step_seconds={},
            compression_ratio=1.0,
        )

    monkeypatch.setattr(network, "run_one", fake_run)
    network.main(["--rates", "200mbit,none", "--methods", "ddp,ab", "--nodes", "1", "--no-matrix"])
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("[bench.network]")]
    assert lines[:4] == [
        "[bench.network] run 1 of 4 started: ddp at 200mbit; elapsed 1m00s, ETA ?",
        "[bench.network] run 1 of 4 finished: ddp at 200mbit in 60 s, best top-1 30.00%; "
        "elapsed 2m00s, ETA 6m00s",
        "[bench.network] run 2 of 4 started: ab at 200mbit; elapsed 3m00s, ETA 9m00s",
        "[bench.network] run 2 of 4 finished: ab at 200mbit in 60 s, best top-1 30.00%; "
        "elapsed 4m00s, ETA 4m00s",
    ]
    assert lines[-1].startswith("[bench.network] run 4 of 4 finished: ab at unshaped")
    assert lines[-1].endswith("ETA 0 s")


def test_merge_replaces_only_the_rerun_methods_and_keeps_their_order(tmp_path, monkeypatch):
    """--merge: a rerun of one method leaves the other methods' committed runs in place."""
    monkeypatch.setattr(network, "RESULTS", tmp_path)
    old = [{"method": m, "steps": 160, "tag": "old"} for m in ("ddp", "ab", "ab_powersgd")]
    (tmp_path / "network-200mbit.json").write_text(json.dumps({"results": old}))
    shape = argparse.Namespace(nodes=2, ranks_per_node=2)
    new = [{"method": "ab_powersgd", "steps": 160, "tag": "new"}]
    got = network.merged(shape, "200mbit", new)
    assert [(r["method"], r["tag"]) for r in got] == [
        ("ddp", "old"),
        ("ab", "old"),
        ("ab_powersgd", "new"),
    ]
    # a shape and rate with no committed file: just the new runs
    assert network.merged(shape, "50mbit", new) == new
