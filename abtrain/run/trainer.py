"""abtrain's own training loop: a plain loop over `ABTraining`, the method's one object.

Each step asks the method for the module to run (`ABTraining.module`: warm-up, AB phases,
syncs and rebounds happen there, Algorithm 1), asks it for the learning rate of its
schedule with the rebound applied (`ABTraining.lr`), and takes an ordinary AdamW step. The run always ends merged and full-rank;
validation always sees that one merged model. A user's own loop makes the same calls
(examples/ab_loop.py).

The trainer composes the rooms around the loop: `process` (process group, device,
signals), `checkpointer` (save and resume), `results` (train log, summary), `tracking`
(MLflow), `progress` (what the user sees), `evaluation`.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from abtrain import models
from abtrain.config import Config
from abtrain.data.datasets import make_task
from abtrain.data.loader import StepSampler
from abtrain.distributed import ledger, process
from abtrain.distributed.process import Launch
from abtrain.files import atomic_write_text
from abtrain.method import methods, schedule
from abtrain.method.abtraining import DONE, ABTraining
from abtrain.method.schedule import PHASE_IDS, Phase
from abtrain.run import evaluation, results
from abtrain.run.checkpointer import Checkpointer, resume_candidates
from abtrain.run.progress import Progress
from abtrain.run.runstate import RunState
from abtrain.tracking import tracker

LOST = (
    "{}, but the tracking store is gone and tracking.required is true: start the run "
    "again once the store is back (it resumes from there and sends what the store missed), "
    "or start it again now with --set tracking.required=false and the same --out to train on "
    "without it (it resumes too), or leave it stopped: `python -m abtrain close {}` once the "
    "store is back marks its MLflow run failed"
)


class TrainingDiverged(RuntimeError):
    """A step's loss or gradient norm, or the merged model's validation loss, is not
    finite: the run stops there, before any checkpoint of it is written."""


class StopForRequeue(RuntimeError):
    """Asked to stop (SIGUSR1, or the ABTRAIN_DEADLINE a batch job sets before its time
    limit); the run checkpointed and wrote DIR/REQUEUE, and resumes when started again."""


class Trainer:
    def __init__(self, cfg: Config, out_dir: str | Path, launch: Launch) -> None:
        self.cfg, self.out, self.launch = cfg, Path(out_dir), launch
        methods.check_world(cfg, launch.world_size, launch.ranks_per_node)  # before joining
        self.backend, self.device = process.start(cfg, launch)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.task = make_task(cfg)
        self.sampler = StepSampler(
            len(self.task), cfg.batch_size, self.rank, self.world, cfg.seed, cfg.data_seed
        )
        self.model = models.build(cfg, self.task.classes, self.task.features).to(self.device)
        self.opt = torch.optim.AdamW(
            self.model.parameters(),
            lr=cfg.optim.lr,
            betas=tuple(cfg.optim.betas),
            weight_decay=cfg.optim.weight_decay,
        )
        # the method: phases, groups, syncs, rebound, ledger; what a user's own loop uses
        self.ab = ABTraining(
            self.model,
            self.opt,
            cfg,
            device=self.device,
            node=launch.node,
            run_dir=self.out,
            ledger_rows=cfg.tracking.ledger_rows,
        )
        self.ledger = self.ab.ledger
        # rank 0 holds the folder's lock until the process exits: one run at a time in it
        self.tracker, self._folder_lock = tracker.open_for_run(
            cfg, self.out, self.rank, self.device, self.ledger
        )
        torch.manual_seed(cfg.seed * 1000 + self.rank)  # per-rank stream for dropout etc.
        self.stops = process.StopRequests()
        self.checkpointer = Checkpointer(
            self.out, cfg, self.rank, self.world, self.ab.nodes, self.device
        )
        self.where = dict(
            run_name=tracker.run_name_for(cfg, self.ab.nodes, launch.ranks_per_node),
            world_size=self.world,
            nodes=self.ab.nodes,
            ranks_per_node=launch.ranks_per_node,
        )
        self.train_log = results.TrainLog(self.out, self.rank)
        self.progress = Progress(self.rank, cfg.steps)
        self.results = results.Results(
            self.out, cfg, self.where, self.tracker, self.task, self.progress
        )
        self.state = RunState()
        self.resumed, self.resumed_run_id = False, None
        self.summary: dict[str, Any] = {}

    # ---------------------------------------------------------------- the loop
    def run(self) -> dict[str, Any]:
        """Train to the end; returns the summary (on rank 0, {} elsewhere)."""
        for _ in self.evaluations():
            pass
        return self.summary

    def evaluations(self) -> Iterator[dict[str, Any]]:
        """Train, yielding each evaluation (the same on every rank) as it is made.

        A consumer that stops early (a search pruning this run) leaves it unfinished.
        """
        status = "FAILED"
        try:
            yield from self._loop()
            status = "FINISHED"
        except (GeneratorExit, StopForRequeue):
            status = "KILLED"
            raise
        finally:
            gc.unfreeze()  # collectable again: a search trains many runs in one process
            self.tracker.finish(status)
            self.stops.restore()

    def _loop(self) -> Iterator[dict[str, Any]]:
        self._resume()
        self._start_tracking()
        started = time.time() - self.state.elapsed
        self.progress.start(self.state.step)
        batches = self.task.train_batches(self.sampler, self.state.step, self.cfg.steps)
        # Each change of phase collects the old DDP wrapper's reference cycle (ABTraining
        # wraps anew), and a full collection scanned every object of torch, timm, Optuna
        # and MLflow too: 0.12-0.4 s a phase change on CPU, most of a search's short
        # evaluations. What exists now is left out of those scans until the loop ends.
        gc.collect()
        gc.freeze()
        while self.state.step < self.cfg.steps:
            net = self._enter(self.state.step)
            if self.state.pending_eval and schedule.merged_at(self.state.step, self.cfg):
                yield self._evaluate()
                if self._stop_early():
                    break
            self._train_step(net, batches)
            self.state.step += 1
            self.state.pending_eval |= self.state.step % self.cfg.eval_every == 0
            self.state.elapsed = time.time() - started
            if self.cfg.checkpoint_every and self.state.step % self.cfg.checkpoint_every == 0:
                if self.state.step < self.cfg.steps:
                    self._checkpoint()
        self.ledger.step = self.state.step  # what follows belongs after the last step
        if self.ab.phase != DONE:
            self._finish_method()  # a run never ends with divergent replicas
            if not self.state.stopped_early:  # (it stopped right after an evaluation)
                yield self._evaluate()
            self.state.elapsed = time.time() - started
            self._checkpoint()
        self.progress.close()
        self.summary = self._finish()
        if self.tracker.must_stop:
            raise tracker.TrackingLost(LOST.format(f"finished (summary in {self.out})", self.out))

    def _enter(self, step: int) -> torch.nn.Module:
        """The method's module for `step`, after any change of phase it makes; what
        changed is logged."""
        before, factorized = self.ab.phase, len(self.ab.factorizations)
        net = self.ab.module(step)
        self._changed(before, factorized)
        return net

    def _finish_method(self) -> None:
        before, factorized = self.ab.phase, len(self.ab.factorizations)
        self.ab.finish()
        self._changed(before, factorized)

    def _changed(self, before: Phase | None, factorized: int) -> None:
        phase = self.ab.phase
        for part, seconds in self.ab.take_times().items():
            self.state.add_time(phase.kind, part, seconds)  # a change's cost is its phase's
        if len(self.ab.factorizations) > factorized:
            self._log_factorization(self.ab.factorizations[-1])
        if phase != before:
            self.progress.log(f"step {self.state.step}: enter {phase.kind} phase")

    def _train_step(
        self, net: torch.nn.Module, batches: Iterator[tuple[torch.Tensor, torch.Tensor]]
    ) -> None:
        cfg, run, kind = self.cfg, self.state, self.ab.phase.kind
        process.fail_if_asked(self.rank, run.step, self.resumed)
        lr = self.ab.lr(run.step, lambda t: schedule.scheduled_lr(t, cfg))
        for g in self.opt.param_groups:
            g["lr"] = lr
        t0 = time.perf_counter()
        x, y = next(batches)  # decoded ahead by the loader's workers
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        t1 = time.perf_counter()
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=cfg.bf16):
            logits = net(x)
        loss = F.cross_entropy(logits.float(), y, label_smoothing=cfg.optim.label_smoothing)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        # the norm of the (all-reduced) gradients; without clipping, scaled by 1.0: unchanged
        clip = cfg.optim.max_grad_norm if cfg.optim.max_grad_norm > 0 else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(trainable, clip)
        self.opt.step()
        loss_value = loss.item()  # waits for the device: the step's time ends here
        if not (math.isfinite(loss_value) and math.isfinite(grad_norm.item())):
            saved = resume_candidates(self.checkpointer.root)
            kept = (
                f"its last checkpoint, of step {saved[0]}, is whole"
                if saved
                else "no checkpoint had been written yet"
            )
            raise TrainingDiverged(
                f"step {run.step} ({kind} phase): loss {loss_value:.6g}, gradient "
                f"norm {grad_norm.item():.6g}; not finite, so the run stops before a "
                f"checkpoint of it (optim.lr={cfg.optim.lr:g}; {kept})"
            )
        t2 = time.perf_counter()
        waited = min(self.ledger.exposed_allreduce_seconds(), t2 - t1)
        run.add_time(kind, "data", t1 - t0)
        run.add_time(kind, "compute", t2 - t1 - waited)
        run.add_time(kind, "comm", waited)
        run.times[kind]["steps"] += 1
        top1 = (logits.argmax(1) == y).float().mean().item() * 100
        run.window = [run.window[0] + loss_value, run.window[1] + top1, run.window[2] + 1]
        run.last_loss = loss_value
        self.train_log.add(run.step, loss_value, lr, kind, t2 - t0, t1 - t0)
        sent = self.ledger.sent
        if run.step % cfg.tracking.log_every == 0:
            self.tracker.metrics(
                run.step,
                dict(
                    loss=loss_value,
                    lr=lr,
                    phase=PHASE_IDS[kind],
                    inter_node_bytes=sent["inter"],
                    intra_node_bytes=sent["intra"],
                ),
            )
        share = run.time_summary()["share"]
        self.progress.step_done(
            run.step,
            f"{kind} loss {loss_value:.3f} lr {lr:.1e} "
            f"inter-node {sent['inter'] / 1e6:.1f} MB/rank | time: data {share['data']:.0%} "
            f"comm {share['comm']:.0%} svd {share['svd']:.0%}",
        )

    def _log_factorization(self, f: dict[str, Any]) -> None:
        ranks, ratio = f["ranks"], f["compression_ratio"]
        # per-layer ranks go to a table (ranks.csv), not one chart per layer
        kept = results.mean_rank_fraction(ranks, self.ab.layers)
        self.tracker.metrics(f["step"], {"compression_ratio": ratio, "rank_fraction_mean": kept})
        self.tracker.text(results.ranks_csv(self.ab.factorizations, self.ab.layers), "ranks.csv")
        k = list(ranks.values())
        self.progress.log(
            f"step {f['step']}: factorised {len(k)} layers, ranks {min(k)}-{max(k)}, "
            f"compression {ratio:.2f}:1"
        )

    # ---------------------------------------------------------------- evaluation
    def _evaluate(self) -> dict[str, Any]:
        """Loss, top-1 and top-5 of the one merged model, each rank on its shard."""
        t0 = process.clock(self.device)
        shard = self.task.val_batches(self.rank, self.world, 4 * self.cfg.batch_size)
        with self.ledger.during("eval"):
            smoothing = self.cfg.optim.label_smoothing if self.cfg.val_loss == "smoothed" else 0.0
            scores, example = evaluation.evaluate(
                self.model, shard, self.device, self.ledger, smoothing
            )
        self.results.example = self.results.example if self.results.example is not None else example
        run = self.state
        result = evaluation.record(
            run, scores, self.sampler.global_batch, len(self.task), self.ledger.sent["inter"]
        )
        facts = self.ab.factorizations
        last = facts[-1]["compression_ratio"] if facts else 1.0
        run.add_time(self.ab.phase.kind, "eval", process.clock(self.device) - t0)
        # inter_node_bytes is a per-step metric already, samples a count, step MLflow's own
        skip = ("inter_node_bytes", "samples", "step")
        logged = {k: v for k, v in result.items() if k not in skip}
        times = run.time_summary()["share"]
        self.tracker.metrics(
            run.step,
            {
                **logged,
                "compression_ratio": last,
                **{f"time_share/{part}": v for part, v in times.items()},
            },
        )
        self.tracker.flush()
        run.pending_eval = False
        self.progress.log(
            f"step {run.step}: val loss {result['val_loss']:.4f} "
            f"top1 {result['val_top1']:.2f}% top5 {result['val_top5']:.2f}%"
        )
        if not math.isfinite(result["val_loss"]):  # all-reduced: every rank stops together
            raise TrainingDiverged(f"validation loss is {result['val_loss']} at step {run.step}")
        return result

    def _stop_early(self) -> bool:
        """The first rule of `early_stopping` whose point is reached with the best top-1
        below its bar stops the run (the same on every rank: evaluations are all-reduced).
        Evaluation i counts from 0, as the authors count epochs: epoch >= after x epochs."""
        run, n = self.state, self.cfg.steps // self.cfg.eval_every
        i, best = run.step // self.cfg.eval_every - 1, max(e["val_top1"] for e in run.evals)
        for rule in self.cfg.early_stopping:
            if i >= rule.after * n and best < rule.min_top1:
                run.stopped_early = dict(step=run.step, best_top1=best, **rule.model_dump())
                self.progress.log(
                    f"stopped early at step {run.step}: best top-1 {best:.2f}% is below "
                    f"{rule.min_top1}% after {rule.after:g} of the evaluations (early_stopping)"
                )
                return True
        return False

    # ---------------------------------------------------------------- checkpoints
    def _checkpoint(self) -> None:
        t0 = process.clock(self.device)
        with self.ledger.during("checkpoint"):
            # One all-reduce tells that every rank has saved, and whether any must stop now;
            # it is recorded before the snapshot, so a resumed run's ledger has it too.
            self.ledger.record("all_reduce", 8, None)
            self.ledger.flush()  # every rank: its tables since the last checkpoint
            self.train_log.flush()  # rank 0
            # Ranks that hold one replica write its state once: the world, until the first
            # factorisation; from then on the A/B group, whose factors' AdamW moments (kept
            # through full-rank phases for the next AB phase) are its own.
            writer = ledger.group_ranks(self.ab.replica_group())[0]
            run_id = self.tracker.run_id or ""
            step = self.state.step
            self.checkpointer.save(step, self.model, self.opt, self.state, self.ab, run_id, writer)
            # 1: asked to stop, to be requeued; 2: the store this run requires is gone, as
            # a write to it now tells (a lost store is not written to between checkpoints)
            if self.tracker.must_stop:
                self.tracker.flush()
            why = max(int(self.stops.requested()), 2 * int(self.tracker.must_stop))
            stop = torch.tensor([why], device=self.device)
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
            if self.rank == 0:
                self.checkpointer.publish(step)
        self.state.add_time(self.ab.phase.kind, "checkpoint", process.clock(self.device) - t0)
        if stop.item() == 2 and step < self.cfg.steps:
            raise tracker.TrackingLost(
                LOST.format(f"stopped at the checkpoint of step {step}", self.out)
            )
        if stop.item() and step < self.cfg.steps:
            if self.rank == 0:
                atomic_write_text(self.out / "REQUEUE", f"{step}\n")
            raise StopForRequeue(f"stopped at the checkpoint of step {step} to be requeued")

    def _resume(self) -> None:
        found = self.checkpointer.resume(self.model, self.opt, self.ab)
        if found is None:
            return
        step, self.state = found
        self.train_log.cut_after(step)
        self.resumed, self.resumed_run_id = True, self.state.run_id or None
        self.progress.log(f"resumed from step {step} ({self.ab.phase.kind} phase)")

    # ---------------------------------------------------------------- results
    def _finish(self) -> dict[str, Any]:
        """Rank 0 writes the results once every rank's logs are in; {} elsewhere."""
        self.ledger.flush()
        self.train_log.flush()
        dist.barrier()
        if self.rank != 0:
            return {}
        return self.results.write(
            self.state,
            self.ab.factorizations,
            self.ledger,
            self.model,
            self.ab.layers,
            self.sampler.global_batch,
            survey=self.ab.survey,
        )

    # ---------------------------------------------------------------- tracking
    def _start_tracking(self) -> None:
        if self.tracker.client is None:
            return
        tags = tracker.run_tags(self.cfg, self.where, self.sampler.global_batch, self.out)
        dataset = tracker.describe_dataset(self.cfg, self.task)
        self.tracker.start(self.cfg, tags, self.resumed_run_id, self.where["run_name"], dataset)
