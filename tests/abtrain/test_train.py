"""Real runs: `python -m abtrain.launch` starts two torchrun "nodes" of two gloo ranks each."""

import csv
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from abtrain import models
from abtrain.commands import localrun
from abtrain.distributed import ledger
from abtrain.method import lowrank, schedule
from abtrain.predict import footprint, traffic
from abtrain.run import checkpointer
from tests.helpers import PARAMS, ROOT, TINY, launch, spawn, summary, tiny_config

METHODS = ["ddp", "ab", "ab_nogroups", "ab_individual", "powersgd", "localsgd", "diloco"]
# The ab run keeps every checkpoint (a setting that changes no number the run computes):
# test_an_ab_run_writes_what_the_planner_predicts reads each.
RUN_SETS = {"ab": ("keep_checkpoints=10",)}


@pytest.fixture(scope="module")
def launch_tmp(tmp_path_factory):
    """The launches' $TMPDIR, where each must leave nothing of its own (torchrun's folders
    went there, one a launch, for good)."""
    return tmp_path_factory.mktemp("tmp")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, launch_tmp):
    """One short run of every method on 2 nodes × 2 ranks, shared by the tests below."""
    out = {}
    for method in METHODS:
        d = tmp_path_factory.mktemp(method)
        env = {"TMPDIR": str(launch_tmp)}
        proc = launch(d, f"method={method}", *RUN_SETS.get(method, ()), env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[method] = d
    return out


def left_in(tmp: Path) -> list[str]:
    """What launches left in their $TMPDIR `tmp`, but torch's cache, one a user, which every
    process that imports torch._dynamo shares (`torchinductor_<user>`)."""
    return sorted(p.name for p in tmp.iterdir() if "torchinductor_" not in p.name)


def final_weights(run_dir, rank, steps=40):
    return checkpointer.model_state(run_dir / "checkpoints", steps, rank)


# ---------------------------------------------------------------- analytic traffic
# On the ring 0→1→2→3→0 with nodes {0,1} and {2,3}, ranks 1 and 3 send across nodes.
# Per rank (mean over the 4 ranks), the inter-node bytes of one collective of S bytes are:
def allreduce_inter(size):  # 2 of 4 ranks send 2·3/4·S across
    return 2 * 1.5 * size / 4


def broadcast_inter(size):  # chain 0→1→2→3 from rank 0: only 1→2 crosses
    return size / 4


def powersgd_payload(cfg, model):
    """Bytes PowerSGD all-reduces per step once compressing: P, Q and the rest uncompressed."""
    r, total = cfg.powersgd.rank, 0
    for p in model.parameters():
        n, m = p.shape[0], p.numel() // p.shape[0]
        k = min(n, m, r)
        total += (n + m) * k if (n + m) * k * 2 < n * m else n * m
    return 4 * total


def expected_inter_node_bytes(method, s):
    cfg = tiny_config(f"method={method}")
    model = models.build(cfg, cfg.data.classes, cfg.data.features)
    full = 4 * sum(p.numel() for p in model.parameters())
    inter = 2 * 3 * 8 / 4  # the node map: all-gather of one int64
    inter += broadcast_inter(8)  # rank 0 tells all whether tracking could start
    inter += broadcast_inter(full)  # DDP's first wrap: rank 0's state to all
    inter += len(s["evals"]) * allreduce_inter(4 * 8)  # loss, top-1, top-5, count (float64)
    every = cfg.checkpoint_every  # each checkpoint: one int64 all-reduce (saved? stop?)
    inter += (len(range(every, cfg.steps, every)) + 1) * allreduce_inter(8)
    # the ledger's per-step tables (step 0 to the end, both included), summed at checkpoints
    inter += allreduce_inter((cfg.steps + 1) * ledger.STEP_TABLE_BYTES)
    steps = Counter(schedule.phase_at(t, cfg).kind for t in range(cfg.steps))
    if method in ("localsgd", "diloco"):  # DDP over the world in the warm-up, then inside
        # each node; every local phase ends in one all-reduce of every parameter (DiLoCo:
        # its pseudo-gradient) over the world, the MLP has no buffers
        local = getattr(cfg, method)
        assert steps["warmup"] == local.warmup_steps and steps["local"] > 0
        syncs = -(-(cfg.steps - local.warmup_steps) // local.period)
        return inter + (steps["warmup"] + syncs) * allreduce_inter(full)
    if method == "ddp":
        return inter + cfg.steps * allreduce_inter(full)
    if method == "powersgd":
        start = cfg.powersgd.start_iter
        return (
            inter
            + start * allreduce_inter(full)
            + (cfg.steps - start) * allreduce_inter(powersgd_payload(cfg, model))
        )
    # AB methods: full-rank DDP over the world in warm-up and rebounds
    inter += (steps["warmup"] + steps["rebound"]) * allreduce_inter(full)
    layers = lowrank.convert(model, None)
    weights = 4 * sum(layer.weight.numel() for layer in layers.values())
    shared = full - weights
    for f in s["factorizations"]:
        inter += allreduce_inter(8 * len(layers))  # agreeing k: one int64 per layer
        factors = {
            n: 4 * k * (layer.weight.shape[0] + layer.weight.shape[1])
            for (n, layer), k in zip(layers.items(), f["ranks"].values())
        }
        if method == "ab_nogroups":  # B (k × in) and the rest by DDP over the world
            b = sum(4 * k * layers[n].weight.shape[1] for n, k in f["ranks"].items())
            inter += steps_in_ab_phase(cfg, f["step"]) * allreduce_inter(b + shared)
        else:  # groups train inside their node; the sync averages A, B, the rest and its
            # two AdamW moments
            inter += allreduce_inter(sum(factors.values()) + 3 * shared)
    return inter


def steps_in_ab_phase(cfg, start):
    return sum(
        1
        for t in range(start, cfg.steps)
        if schedule.phase_at(t, cfg) == schedule.phase_at(start, cfg)
    )


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.multiprocess
def test_method_runs_on_two_nodes_and_ledger_matches_analytic_bytes(runs, method):
    s = summary(runs[method])
    assert s["method"] == method and s["world_size"] == 4 and s["nodes"] == 2
    assert s["steps"] == 40 and s["wall_seconds"] > 0
    assert 0 <= s["val_top1"]["final"] <= s["val_top1"]["best"] <= 100
    t = s["traffic"]
    assert t["inter_node_bytes"] == pytest.approx(expected_inter_node_bytes(method, s), rel=1e-9)
    assert t["total_bytes"] == pytest.approx(t["inter_node_bytes"] + t["intra_node_bytes"])
    assert t["inter_node_bytes"] == pytest.approx(sum(p["inter"] for p in t["by_phase"].values()))
    rows = [
        line for line in (runs[method] / "ledger.jsonl").read_text().splitlines() if line.strip()
    ]
    assert {int(re.search(r'"rank": (\d+)', r).group(1)) for r in rows} == {0, 1, 2, 3}
    if method.startswith("ab"):
        assert (
            s["factorizations"]
            and s["compression_ratio"] == s["factorizations"][-1]["compression_ratio"]
        )
        assert {"warmup", "ab", "rebound", "factorize"} <= set(t["by_phase"])
        # one group of all ranks already agrees at the sync: nothing to send
        assert ("sync" in t["by_phase"]) == (method != "ab_nogroups")
    else:
        assert s["compression_ratio"] == 1.0


@pytest.mark.multiprocess
def test_ab_halves_inter_node_traffic_against_ddp(runs):
    ab = summary(runs["ab"])["traffic"]["inter_node_bytes"]
    ddp = summary(runs["ddp"])["traffic"]["inter_node_bytes"]
    assert ab <= 0.6 * ddp
    # inside the AB phase the groups talk within their node only
    assert summary(runs["ab"])["traffic"]["by_phase"]["ab"]["inter"] == 0


@pytest.mark.multiprocess
def test_replicas_end_merged_and_identical(runs):
    for method in ("ab", "ab_individual"):
        states = [final_weights(runs[method], r) for r in range(4)]
        for key, value in states[0].items():
            for other in states[1:]:
                assert torch.equal(value, other[key]), (method, key)


@pytest.mark.multiprocess
def test_an_ab_run_writes_what_the_planner_predicts(runs):
    """The AB run on 2 nodes x 2 ranks: its ledger rows, logs and every checkpoint's files
    against abtrain.predict.footprint (tests/abtrain/test_traffic_footprint.py tests its
    arithmetic; this is the real run it predicts)."""
    run = runs["ab"]
    cfg = tiny_config("method=ab", *RUN_SETS["ab"])
    summary = json.loads((run / "summary.json").read_text())
    ranks = [k for f in summary["factorizations"] for k in f["ranks"].values()]
    keep = sum(ranks) / len(ranks) / cfg.model.width
    s = traffic.sizes(cfg, 10, keep)
    groups = traffic.ab_groups(cfg, 4, 2)
    calls = footprint.ledger_calls(cfg, s, groups, 4, 2)

    csv = (run / "ledger.csv").read_text().splitlines()[1:]
    written = {}
    for line in csv:
        step, phase, op, n = line.split(",")[:4]
        written[int(step), phase, op] = int(n)
    assert written == calls  # every row, and how many collectives each one sums
    jsonl = (run / "ledger.jsonl").read_text().splitlines()
    assert len(jsonl) == sum(calls.values())
    assert len((run / "train_log.csv").read_text().splitlines()) == cfg.steps + 1

    carry = cfg.ab.optimizer_state == "carry"
    for folder in sorted((run / "checkpoints").glob("step_*")):
        step = int(folder.name.split("_")[1])
        low_rank = step < cfg.steps and schedule.phase_at(step - 1, cfg).low_rank
        if step <= cfg.ab.warmup_steps:  # one replica: the full-rank model
            want = footprint.saved_replica_bytes(s, "full", "a", carry)
        else:  # one per group: A and B kept beside W, and each group's own moments
            kind = "ab" if low_rank else "rebound"
            want = sum(footprint.saved_replica_bytes(s, kind, r, carry) for _, r in groups)
        got = sum(p.stat().st_size for p in folder.glob("replica_*.pt"))
        assert got == pytest.approx(want, rel=0.03), folder.name
        evals = sum(e["step"] <= step for e in summary["evals"])
        facts = sum(f["step"] < step for f in summary["factorizations"])
        own = footprint.rank_state_bytes(s, evals, facts, cuda=False)
        for p in folder.glob("rank_*.pt"):
            assert p.stat().st_size == pytest.approx(own, rel=0.05), p


@pytest.mark.multiprocess
def test_ddp_equals_one_process_on_the_concatenated_batch(runs, tmp_path):
    proc = launch(tmp_path, "method=ddp", "batch_size=64", nnodes=1, nproc=1)
    assert proc.returncode == 0, proc.stderr[-3000:]
    single = final_weights(tmp_path, 0)
    for key, value in final_weights(runs["ddp"], 0).items():
        torch.testing.assert_close(value, single[key], atol=2e-5, rtol=1e-4)


def assert_one_replica_per_group(run_dir, step):
    """Each A/B group is one replica: its state is written once, by its first rank."""
    saved = sorted(p.name for p in checkpointer.step_dir(run_dir / "checkpoints", step).iterdir())
    assert saved == [
        "meta.json",
        *(f"rank_{r}.pt" for r in range(4)),
        "replica_0.pt",
        "replica_2.pt",
    ]


def resume_and_compare(uninterrupted, run_dir, said, method="ab"):
    resumed = launch(run_dir, f"method={method}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert said in resumed.stdout
    for rank in range(4):
        want, got = final_weights(uninterrupted, rank), final_weights(run_dir, rank)
        for key in want:
            assert torch.equal(want[key], got[key]), (rank, key)


@pytest.mark.multiprocess
def test_killed_run_resumes_to_the_same_weights_and_loss_bit_for_bit(runs, tmp_path):
    # rank 3 dies at step 25, inside an AB phase (replicas differ); last checkpoint: step 20
    start = time.monotonic()
    killed = launch(tmp_path, "method=ab", env={"ABTRAIN_FAIL_AT": "3:25"})
    assert killed.returncode != 0 and not (tmp_path / "summary.json").exists()
    assert time.monotonic() - start < 120  # the others stopped instead of hanging
    log = killed.stdout + killed.stderr
    reports = "".join(p.read_text() for p in (tmp_path / "logs").glob("node-*.log"))
    assert re.search(r"rank\s*:\s*3 \(local_rank: 1\)", reports), log[-3000:]  # torchrun's
    assert re.search(r"rank [0-2] \(node \d\) failed", log)  # survivors stopped by themselves
    # the last line names the rank that died without a word, not a survivor's complaint
    last = killed.stderr.strip().splitlines()[-1]
    assert last.startswith("[abtrain.launch] error: rank 3 (node 1) exited with code 13"), last
    assert (tmp_path / "checkpoints" / "LATEST").read_text().strip() == "20"
    assert_one_replica_per_group(tmp_path, 20)  # inside an AB phase
    resume_and_compare(runs["ab"], tmp_path, "resumed from step 20 (ab phase)")
    a, b = summary(runs["ab"]), summary(tmp_path)

    def timeless(evals):
        return [{k: v for k, v in e.items() if k != "seconds"} for e in evals]

    assert timeless(a["evals"]) == timeless(b["evals"])
    assert a["train_loss_final"] == b["train_loss_final"]
    assert a["traffic"]["inter_node_bytes"] == b["traffic"]["inter_node_bytes"]


@pytest.mark.multiprocess
def test_ranks_the_launcher_forks_train_bit_for_bit_as_ranks_torchrun_starts_afresh(runs, tmp_path):
    """The launcher forks each node's ranks from its torchrun (one thread a rank, as here);
    a cluster's torchrun starts them afresh. The same AB run started the cluster's way,
    two `torchrun` commands of one thread a rank, ends in the same weights on every rank."""
    assert localrun.FORKED in (runs["ab"] / "logs" / "node-0.log").read_text()
    out = tmp_path / "run"
    args = ["train", "--config", str(PARAMS), "--out", str(out)]
    for o in [*TINY, "method=ab", *RUN_SETS["ab"]]:
        args += ["--set", o]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    nodes = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", *cmd],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for cmd in localrun.torchrun_commands(
            2, 2, args, localrun.free_port(), tmp_path / "torchrun"
        )
    ]
    for node in nodes:
        _, err = node.communicate(timeout=240)
        assert node.returncode == 0, err[-3000:]
    for rank in range(4):
        want, got = final_weights(runs["ab"], rank), final_weights(out, rank)
        for key in want:
            assert torch.equal(want[key], got[key]), (rank, key)
    a, b = summary(runs["ab"]), summary(out)
    assert a["train_loss_final"] == b["train_loss_final"]
    assert a["traffic"]["inter_node_bytes"] == b["traffic"]["inter_node_bytes"]


@pytest.mark.multiprocess
def test_the_launches_leave_nothing_in_tmpdir(runs, launch_tmp):
    """Seven launches, each two torchruns: none leaves a folder behind (torchrun makes one
    a launch when it is given no `--log-dir`, and never removes it)."""
    assert not left_in(launch_tmp)


@pytest.mark.multiprocess
def test_a_run_killed_after_a_rebound_checkpoint_resumes_bit_for_bit(runs, launch_tmp, tmp_path):
    # checkpoint 30 falls in a rebound phase: full rank, but each group's factors keep
    # AdamW moments of their own for the next AB phase, so each group saves its replica
    env = {"ABTRAIN_FAIL_AT": "1:33", "TMPDIR": str(launch_tmp)}
    killed = launch(tmp_path, "method=ab", env=env)
    assert killed.returncode != 0
    assert not left_in(launch_tmp)  # a failed launch too leaves nothing there
    assert_one_replica_per_group(tmp_path, 30)
    resume_and_compare(runs["ab"], tmp_path, "resumed from step 30 (rebound phase)")
    assert summary(tmp_path)["train_loss_final"] == summary(runs["ab"])["train_loss_final"]


@pytest.mark.multiprocess
def test_diloco_killed_inside_a_local_phase_resumes_bit_for_bit(runs, tmp_path):
    """Checkpoint 30 falls inside a local phase (28-31): each node's replica (its inner
    AdamW moments) is saved by its first rank, with the outer weights and momentum."""
    killed = launch(tmp_path, "method=diloco", env={"ABTRAIN_FAIL_AT": "1:33"})
    assert killed.returncode != 0
    assert schedule.phase_at(29, tiny_config("method=diloco")).kind == "local"
    assert_one_replica_per_group(tmp_path, 30)
    resume_and_compare(runs["diloco"], tmp_path, "resumed from step 30", method="diloco")
    assert summary(tmp_path)["train_loss_final"] == summary(runs["diloco"])["train_loss_final"]


@pytest.mark.multiprocess
def test_diloco_with_outer_lr_1_and_no_momentum_is_local_sgd(runs, tmp_path):
    """Its outer step is then anchor - mean(anchor - node) = the nodes' mean: local SGD's
    average, to float rounding; with the default outer step it is not."""
    run = launch(tmp_path, "method=diloco", "diloco.outer_lr=1.0", "diloco.outer_momentum=0")
    assert run.returncode == 0, run.stderr[-3000:]
    local, default = final_weights(runs["localsgd"], 0), final_weights(runs["diloco"], 0)
    plain = final_weights(tmp_path, 0)
    for key in local:
        torch.testing.assert_close(plain[key], local[key], rtol=1e-4, atol=1e-6)
    assert any(not torch.allclose(default[k], local[k], atol=1e-4) for k in local)


@pytest.mark.multiprocess
def test_local_sgd_on_abs_schedule_is_ab_without_the_factorisation(tmp_path):
    """`localsgd.schedule=ab`, the matched ablation: AB's warm-up, phases, rebounds and LR
    restarts, the full model trained inside each node in place of the factors. Its ledger:
    DDP over the world in the warm-up and rebounds, nothing across nodes in a local phase,
    one all-reduce of every parameter at each local phase's end."""
    run = launch(tmp_path, "method=localsgd", "localsgd.schedule=ab")
    assert run.returncode == 0, run.stderr[-3000:]
    s, cfg = summary(tmp_path), tiny_config("method=localsgd", "localsgd.schedule=ab")
    assert {"warmup", "local", "rebound"} <= s["time"]["by_phase"].keys()
    assert "ab" not in s["time"]["by_phase"] and s["factorizations"] == []
    steps = Counter(schedule.phase_at(t, cfg).kind for t in range(cfg.steps))
    ab = tiny_config("method=ab")  # AB's phases, step for step
    assert [schedule.phase_at(t, ab).kind for t in range(40)] == [
        "ab" if k == "local" else k for k in (schedule.phase_at(t, cfg).kind for t in range(40))
    ]
    model = models.build(cfg, cfg.data.classes, cfg.data.features)
    full = 4 * sum(p.numel() for p in model.parameters())
    syncs = len({schedule.phase_at(t, cfg).cycle for t in range(40)} - {-1})
    by_phase = s["traffic"]["by_phase"]
    assert by_phase["local"]["inter"] == 0
    assert by_phase["sync"]["inter"] == syncs * allreduce_inter(full)
    assert by_phase["rebound"]["inter"] == steps["rebound"] * allreduce_inter(full)
    # the LR restarts after each change, as AB's: the train log's LR at each local start
    with (tmp_path / "train_log.csv").open() as f:
        lrs = {int(r["step"]): float(r["lr"]) for r in csv.DictReader(f)}
    for start, phase in schedule.phases(cfg)[1:]:
        assert lrs[start] < lrs[start - 1], (start, phase)
    predicted = traffic.estimate(cfg, nodes=2, ranks_per_node=2, classes=10)
    assert predicted.inter_bytes == pytest.approx(s["traffic"]["inter_node_bytes"], rel=1e-9)


@pytest.mark.multiprocess
def test_a_run_folder_refuses_another_config(runs):
    proc = launch(runs["ddp"], "method=ddp", "optim.lr=0.1", nnodes=1, nproc=1)
    assert proc.returncode != 0
    assert "optim.lr differ" in proc.stderr


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.multiprocess
def test_planner_predicts_the_ledger_without_training(runs, method):

    s = summary(runs[method])
    cfg = tiny_config(f"method={method}")
    keeps = {k / 64 for f in s["factorizations"] for k in f["ranks"].values()} or {1.0}
    predicted = traffic.estimate(cfg, nodes=2, ranks_per_node=2, classes=10, keep=max(keeps))
    measured = s["traffic"]["inter_node_bytes"]
    if keeps == {1.0}:
        assert predicted.inter_bytes == pytest.approx(measured, rel=1e-9)
    else:  # ranks that training cut are an assumption of the planner
        assert predicted.inter_bytes >= measured * 0.95


# ---------------------------------------------------------------- AB with PowerSGD
COMBINED = ("method=ab_powersgd", "ab.sync_mode=only_learned")


@pytest.fixture(scope="module")
def combined(tmp_path_factory):
    d = tmp_path_factory.mktemp("ab_powersgd")
    proc = launch(d, *COMBINED)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return d


@pytest.mark.multiprocess
def test_ab_powersgd_compresses_the_full_rank_steps_and_syncs_only_what_was_trained(combined):
    """Counted independently of the planner: PowerSGD's payload in every full-rank step
    after its first start_iter ones, nothing across nodes in AB phases, and syncs that send
    each trained factor once across the node boundary (A from rank 0, B from rank 2)."""
    s = summary(combined)
    cfg = tiny_config(*COMBINED)
    model = models.build(cfg, cfg.data.classes, cfg.data.features)
    full = 4 * sum(p.numel() for p in model.parameters())
    inter = 2 * 3 * 8 / 4 + broadcast_inter(8) + broadcast_inter(full)
    inter += len(s["evals"]) * allreduce_inter(4 * 8)
    every = cfg.checkpoint_every
    inter += (len(range(every, cfg.steps, every)) + 1) * allreduce_inter(8)
    inter += allreduce_inter((cfg.steps + 1) * ledger.STEP_TABLE_BYTES)
    full_rank = [t for t in range(cfg.steps) if not schedule.phase_at(t, cfg).low_rank]
    start = cfg.powersgd.start_iter
    inter += start * allreduce_inter(full)
    inter += (len(full_rank) - start) * allreduce_inter(powersgd_payload(cfg, model))
    layers = lowrank.convert(model, None)
    shared = full - 4 * sum(layer.weight.numel() for layer in layers.values())
    for f in s["factorizations"]:
        inter += allreduce_inter(8 * len(layers))
        a = sum(4 * k * layers[n].weight.shape[0] for n, k in f["ranks"].items())
        b = sum(4 * k * layers[n].weight.shape[1] for n, k in f["ranks"].items())
        # learners' all-reduces stay inside their node; each factor crosses once
        inter += broadcast_inter(a) + broadcast_inter(b) + allreduce_inter(3 * shared)
    t = s["traffic"]
    assert t["inter_node_bytes"] == pytest.approx(inter, rel=1e-9)
    assert t["by_phase"]["ab"]["inter"] == 0

    keeps = {k / 64 for f in s["factorizations"] for k in f["ranks"].values()}
    predicted = traffic.estimate(cfg, nodes=2, ranks_per_node=2, classes=10, keep=max(keeps))
    if keeps == {1.0}:
        assert predicted.inter_bytes == pytest.approx(t["inter_node_bytes"], rel=1e-9)
    else:
        assert predicted.inter_bytes >= t["inter_node_bytes"] * 0.95


@pytest.mark.multiprocess
def test_ab_powersgd_sends_less_than_half_of_ab_and_ends_merged(runs, combined):
    # (on this tiny MLP its syncs, every 11 steps, outweigh what PowerSGD alone sends; on
    # the default profile it sends 0.094x ddp's bytes to PowerSGD's 0.098x, reports/)
    mine = summary(combined)["traffic"]["inter_node_bytes"]
    assert mine < summary(runs["ab"])["traffic"]["inter_node_bytes"] / 2
    w0 = final_weights(combined, 0)
    for rank in (1, 2, 3):
        for k, v in final_weights(combined, rank).items():
            assert torch.equal(v, w0[k]), k


def test_ab_powersgd_drops_error_feedback_at_a_sync_and_keeps_its_warm_start(tmp_path):
    import torch.distributed as dist

    from abtrain.distributed.ledger import Ledger
    from abtrain.method import methods

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        cfg, led, m = tiny_config(*COMBINED), Ledger(0, [0]), methods.make("ab_powersgd")
        state, _ = m.comm_hook(cfg, led, None)  # the warm-up
        state.error_dict[0] = torch.ones(3)
        state.q_memory_dict[0] = torch.ones(2)
        group = dist.new_group([0])
        assert m.comm_hook(cfg, led, group)[0] is None  # an AB phase: plain, in the group
        again, _ = m.comm_hook(cfg, led, None)  # the rebound after the sync
        assert again is state and not state.error_dict and 0 in state.q_memory_dict
        assert not m.rewrap_at_checkpoint
    finally:
        dist.destroy_process_group()


def _borrowed_usr1(rank, world, out):
    import signal

    from abtrain.distributed.process import Launch
    from abtrain.run.trainer import Trainer

    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # as the SLURM job's `trap "" USR1` leaves it
    cfg = tiny_config("method=ddp", "steps=4", "eval_every=2", "checkpoint_every=0")
    trainer = Trainer(cfg, out, Launch(rank, world, 0, 1, 0))
    during = [
        signal.getsignal(signal.SIGUSR1) == trainer.stops.on_signal for _ in trainer.evaluations()
    ]
    return during, signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN


@pytest.mark.multiprocess
def test_a_run_gives_sigusr1_back_as_it_found_it(tmp_path):
    """While it trains, SIGUSR1 asks for a stop at the next checkpoint; after, the launcher's
    "ignore" is back. Left with our handler, Python's shutdown resets it to the default
    action, which kills a rank that SLURM signals just as it stopped at its deadline."""
    [(during, after)] = spawn(_borrowed_usr1, world=1, ranks_per_node=1, args=(tmp_path,))
    assert during and all(during)
    assert after


@pytest.mark.multiprocess
def test_early_stopping_ends_a_run_at_the_first_rule_it_fails(tmp_path):
    """The authors' rule: at evaluation i (from 0, of 4 here) >= after x 4, a best top-1
    below min_top1 stops the run; it ends merged, with its summary saying where and why."""
    rules = "early_stopping=[{after: 0.9, min_top1: 0.0}, {after: 0.3, min_top1: 100.0}]"
    proc = launch(tmp_path, "method=ddp", rules, nnodes=1, nproc=1)
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = summary(tmp_path)
    assert s["steps"] == 30 and [e["step"] for e in s["evals"]] == [10, 20, 30]
    assert s["stopped_early"] == dict(step=30, best_top1=s["val_top1"]["best"], after=0.3,
                                      min_top1=100.0)  # fmt: skip
    assert "stopped early at step 30" in proc.stdout + proc.stderr
    assert (tmp_path / "model.pt").exists()


C3DBC10 = ("method=ab_nogroups", "ab.group_size=2", "ab.sync_mode=rank0", "ab.split_sigma=false")
C3DBC10 += ("ab.full_rank_layers=[]", "ab.sigma_cutoff=0.000001")  # every layer, full rank


@pytest.mark.multiprocess
def test_the_authors_c3dbc10_no_groups_run_sends_what_the_planner_predicts(tmp_path):
    """Two half-world groups (nodes here) train B = ΣVᵀ of every layer, the head's wide
    10 x 64 too (B is k x 10); each sync sends rank 0's W and the rest, nothing averaged."""

    proc = launch(tmp_path, *C3DBC10)
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = summary(tmp_path)
    assert s["full_rank_layers"] == {}
    ranks = (tmp_path / "ranks.csv").read_text().splitlines()
    assert ranks[0].endswith("a_shape,b_shape")
    assert any(r.startswith("8,head,10,10,64,10,1,64x10,10x10") for r in ranks)
    predicted = traffic.estimate(tiny_config(*C3DBC10), nodes=2, ranks_per_node=2, classes=10)
    assert predicted.inter_bytes == pytest.approx(s["traffic"]["inter_node_bytes"], rel=1e-9)
    by_phase = s["traffic"]["by_phase"]
    assert by_phase["ab"]["inter"] == 0  # each group is a node
    # the planner's syncs include agreeing on k, which the ledger books as `factorize`
    sent = by_phase["sync"]["inter"] + by_phase["factorize"]["inter"]
    assert sent == pytest.approx(predicted.event_bytes["sync"], rel=1e-9)
