"""The rooms the trainer composes, each on its own: the method objects, the checkpointer,
the results writer, the stop requests, progress and evaluation records. One process; a
one-rank gloo group where a collective is needed."""

import json
import os
import signal
import time

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

from abtrain import models
from abtrain.config import ConfigError
from abtrain.distributed import process
from abtrain.distributed.ledger import Ledger
from abtrain.files import take_folder
from abtrain.method import methods
from abtrain.method.abtraining import ABTraining
from abtrain.run import evaluation, results
from abtrain.run.checkpointer import Checkpointer
from abtrain.run.progress import Progress
from abtrain.run.runstate import RunState
from tests.helpers import tiny_config


@pytest.fixture
def one_rank():
    # an in-memory store: nothing on disk for a group of one
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


# ---------------------------------------------------------------- methods
@pytest.mark.parametrize(
    "method, world, per_node, size",
    [
        ("ddp", 4, 2, 4),
        ("powersgd", 4, 2, 4),
        ("ab", 4, 2, 2),  # a group per node
        ("ab_powersgd", 8, 4, 4),
        ("ab_individual", 4, 2, 1),
        ("ab_nogroups", 4, 2, 4),  # one group of the world
    ],
)
def test_each_method_answers_its_group_size(method, world, per_node, size):
    cfg = tiny_config(f"method={method}")
    assert methods.make(method).group_size(cfg, world, per_node) == size
    assert methods.check_world(cfg, world, per_node) == size


def test_group_rules_refuse_naming_the_key():
    with pytest.raises(ConfigError, match="ab.group_size=3 does not divide"):
        methods.check_world(tiny_config("ab.group_size=3"), 4, 2)
    with pytest.raises(ConfigError, match="one A group and one B group"):
        methods.check_world(tiny_config(), 2, 2)
    with pytest.raises(ConfigError, match="with_stale"):
        methods.check_world(
            tiny_config("method=ab_nogroups", "ab.group_size=2", "ab.sync_mode=only_learned"), 4, 2
        )


@pytest.mark.parametrize(
    "method, sets, per_node, smallest",
    [
        ("ddp", [], None, (1, 1)),
        ("ab", [], None, (2, 1)),  # two nodes of one rank
        ("ab", [], 4, (8, 4)),
        ("ab", ["ab.group_size=2"], None, (4, 4)),
        ("ab_individual", [], None, (2, 2)),
        ("ab_nogroups", [], None, (1, 1)),
    ],
)
def test_each_method_knows_the_fewest_ranks_it_runs_on(method, sets, per_node, smallest):
    cfg = tiny_config(f"method={method}", *sets)
    world, rpn = methods.make(method).smallest_world(cfg, per_node)
    assert (world, rpn) == smallest
    methods.check_world(cfg, world, rpn)  # and it does run there


def test_only_methods_with_ab_phases_factorise_and_only_powersgd_ones_compress():
    low = {m for m, k in methods.KINDS.items() if k.low_rank}
    squeeze = {m for m, k in methods.KINDS.items() if k.compresses}
    assert low == {"ab", "ab_individual", "ab_nogroups", "ab_powersgd"}
    assert squeeze == {"powersgd", "ab_powersgd"}


def test_powersgd_is_counted_without_touching_torch(one_rank):
    """The ledger counts PowerSGD's all-reduces (its uncompressed start, then the rest, P
    and Q) while torch's own modules keep the real torch.distributed."""
    cfg = tiny_config("method=powersgd", "powersgd.start_iter=2", "powersgd.rank=1")
    led = Ledger(0, [0])
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 4))
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1e6)
    ddp.register_comm_hook(*methods.make("powersgd").comm_hook(cfg, led, None))
    assert powerSGD_hook.dist is dist and default_hooks.dist is dist
    calls = []
    for _ in range(4):
        ddp(torch.randn(8, 16)).sum().backward()
        calls.append(int(led.pending[0][..., 2].sum()))
    # two steps of one plain all-reduce; then three a step (uncompressed rest, P, Q)
    assert calls == [1, 2, 5, 8]


# ---------------------------------------------------------------- checkpointer
def test_checkpointer_saves_and_resumes_the_same_state(one_rank, tmp_path):
    cfg = tiny_config("method=ddp")
    out = tmp_path / "run"
    model = models.build(cfg, 10, 64)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.randn(4, 64)).sum().backward()
    opt.step()
    run = RunState(step=10, evals=[dict(step=10, val_top1=1.0)])
    method = ABTraining(model, opt, cfg)
    cpu = torch.device("cpu")
    keeper = Checkpointer(out, cfg, 0, 1, 1, cpu)
    assert keeper.resume(model, opt, method) is None  # a new run: its config kept
    assert json.loads((out / "config.json").read_text()) == cfg.dump()
    keeper.save(10, model, opt, run, method, "run-id", writer=0)
    keeper.publish(10)
    after = torch.rand(3)

    model2 = models.build(cfg, 10, 64)
    opt2 = torch.optim.AdamW(model2.parameters(), lr=0.01)
    method2 = ABTraining(model2, opt2, cfg)
    step, run2 = keeper.resume(model2, opt2, method2)
    assert step == 10 and run2.run_id == "run-id" and run2.evals == run.evals
    for (k, a), b in zip(model.state_dict().items(), model2.state_dict().values()):
        assert torch.equal(a, b), k
    assert torch.equal(torch.rand(3), after)  # the RNG where the checkpoint left it

    other = Checkpointer(out, tiny_config("method=ddp", "optim.lr=0.5"), 0, 1, 1, cpu)
    with pytest.raises(RuntimeError, match="optim.lr"):
        other.resume(model2, opt2, method2)


def test_a_run_folder_takes_one_run(tmp_path):
    lock, error = take_folder(tmp_path / "run")
    assert lock is not None and not error
    # a second process (not this one: the lock is per-process reentrant) is refused
    script = (
        "import sys; from pathlib import Path; from abtrain.files import take_folder; "
        f"print(take_folder(Path({str(tmp_path / 'run')!r}))[1])"
    )
    import subprocess
    import sys

    said = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert "is in use by another run" in said.stdout, said.stderr
    lock.release()


# ---------------------------------------------------------------- results
def test_train_log_keeps_what_a_checkpoint_saw(tmp_path):
    log = results.TrainLog(tmp_path, rank=0)
    for step in range(6):
        log.add(step, 1.0 / (step + 1), 1e-3, "warmup", 0.1, 0.01)
    log.flush()
    with open(tmp_path / "train_log.csv", "a") as f:
        f.write("6,0.1")  # a line cut by a crash
    log.cut_after(4)
    lines = (tmp_path / "train_log.csv").read_text().splitlines()
    assert lines[0] == results.TRAIN_LOG_HEADER
    assert [ln.split(",")[0] for ln in lines[1:]] == ["0", "1", "2", "3"]
    other = results.TrainLog(tmp_path, rank=1)  # only rank 0 writes
    other.add(9, 1.0, 1.0, "ab", 0.0, 0.0)
    other.flush()
    assert len((tmp_path / "train_log.csv").read_text().splitlines()) == 5


def test_summary_and_final_metrics_agree():
    cfg = tiny_config()
    run = RunState(step=40, elapsed=12.5, last_loss=0.5)
    run.evals = [dict(val_top1=20.0, val_loss=2.0), dict(val_top1=30.0, val_loss=1.5)]
    facts = [dict(step=8, compression_ratio=2.5, ranks={"l": 3})]
    traffic = dict(inter_node_bytes=4000.0, intra_node_bytes=100.0)
    where = dict(run_name="x", world_size=4, nodes=2, ranks_per_node=2)
    s = results.summarize(cfg, run, facts, traffic, where, global_batch=64, train_samples=2000)
    assert s["val_top1"] == dict(best=30.0, final=30.0) and s["compression_ratio"] == 2.5
    assert s["traffic"]["inter_node_bytes_per_step"] == 4000.0 / cfg.steps
    assert s["epochs"] == cfg.steps * 64 / 2000
    m = results.final_metrics(s)
    assert m["final/inter_node_mb_per_step"] == round(4000.0 / cfg.steps / 1e6, 3)
    assert m["final/val_top1_best"] == 30.0 and m["epoch"] == s["epochs"]


# ---------------------------------------------------------------- process, progress, evaluation
def test_stop_requests_come_from_sigusr1_or_the_deadline(monkeypatch):
    monkeypatch.delenv("ABTRAIN_DEADLINE", raising=False)
    before = signal.getsignal(signal.SIGUSR1)
    stops = process.StopRequests()
    assert not stops.requested()
    os.kill(os.getpid(), signal.SIGUSR1)
    assert stops.requested()
    stops.restore()
    assert signal.getsignal(signal.SIGUSR1) == before
    monkeypatch.setenv("ABTRAIN_DEADLINE", str(int(time.time()) - 1))
    assert process.StopRequests().requested()


def test_progress_logs_about_twenty_lines_off_a_terminal(capsys):
    p = Progress(rank=0, steps=100)
    p.start(0)
    for step in range(100):
        p.step_done(step, "ab loss 1.0")
    p.close()
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "s/step, ETA" in ln]
    assert len(lines) == 21  # every fifth step, and the last
    assert Progress(rank=1, steps=10).tty is False


def test_an_evaluation_record_closes_the_training_window():
    run = RunState(step=20, elapsed=3.0, window=[4.0, 150.0, 2.0])
    scores = dict(val_loss=1.0, val_top1=50.0, val_top5=90.0)
    r = evaluation.record(run, scores, global_batch=32, train_samples=640, sent=123)
    assert r["train_loss"] == 2.0 and r["train_top1"] == 75.0
    assert r["samples"] == 640 and r["epoch"] == 1.0 and r["inter_node_bytes"] == 123
    assert run.window == [0.0, 0.0, 0.0] and run.evals == [r]
