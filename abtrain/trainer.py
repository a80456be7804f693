"""The training loop: Algorithm 1 of the paper, read top to bottom in `Trainer.run`.

Warm-up (full-rank DDP over the world) → repeat { factorise every W into A·B, each group
trains its factor with DDP inside the group → average A and B over the world, W = A·B →
full-rank rebound with DDP over the world } until `steps`. The run always ends merged and
full-rank; validation always sees that one merged model. DDP and PowerSGD run the same
loop with a single full-rank phase.
"""

from __future__ import annotations

import gc
import io
import json
import math
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import filelock
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from abtrain import batchnorm, checkpoint, groups, ledger, lowrank, methods, models, schedule, sync
from abtrain.config import Config, check_world
from abtrain.data import StepSampler, make_task
from abtrain.runstate import RunState
from abtrain.schedule import PHASE_IDS, Phase
from abtrain.tracking import (
    Tracker,
    TrackingError,
    dataset_digest,
    git_commit,
    run_name_for,
    source_tags,
)

DONE = Phase("done")
TRAIN_LOG_HEADER = "step,loss,lr,phase,seconds,data_seconds"


class TrainingDiverged(RuntimeError):
    """A step's loss or gradient norm, or the merged model's validation loss, is not
    finite: the run stops there, before any checkpoint of it is written."""


class StopForRequeue(RuntimeError):
    """Asked to stop (SIGUSR1, or the ABTRAIN_DEADLINE a batch job sets before its time
    limit); the run checkpointed and wrote DIR/REQUEUE, and resumes when started again."""


@dataclass(frozen=True)
class Launch:
    """Where this process stands, as the launcher (torchrun, SLURM) told it."""

    rank: int
    world_size: int
    local_rank: int
    ranks_per_node: int
    node: int

    @classmethod
    def from_env(cls) -> Launch:
        world = int(os.environ.get("WORLD_SIZE", 1))
        return cls(
            rank=int(os.environ.get("RANK", 0)),
            world_size=world,
            local_rank=int(os.environ.get("LOCAL_RANK", 0)),
            ranks_per_node=int(os.environ.get("LOCAL_WORLD_SIZE", world)),
            node=groups.node_id_from_env(),
        )


def final_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """The run's figures as summary.json holds them, logged at the last step so that MLflow
    and summary.json agree to the bit. The headline ones go under `final/`, which sorts them
    to the top of the compare view's metric table (its first seven rows show without
    scrolling, and the system metrics would otherwise come first); the rest are the last
    point of the running series."""
    t = summary["traffic"]
    return {
        "final/inter_node_mb_per_step": t["inter_node_bytes_per_step"] / 1e6,
        "final/val_top1_best": summary["val_top1"]["best"],
        "final/val_top1_final": summary["val_top1"]["final"],
        "final/compression_ratio": summary["compression_ratio"],
        "final/wall_seconds": summary["wall_seconds"],
        "inter_node_bytes": t["inter_node_bytes"],
        "inter_node_bytes_per_step": t["inter_node_bytes_per_step"],
        "intra_node_bytes": t["intra_node_bytes"],
        "compression_ratio": summary["compression_ratio"],
        "epoch": summary["epochs"],
        **{f"time_share/{part}": v for part, v in summary["time"]["share"].items()},
    }


def fit_shape(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Truncate or zero-pad `t` to `shape`, keeping the top-left corner."""
    out = t.new_zeros(shape)
    if t.dim() == len(shape):
        region = tuple(slice(0, min(a, b)) for a, b in zip(t.shape, shape))
        out[region] = t[region]
    return out


class Trainer:
    def __init__(self, cfg: Config, out_dir: str | Path, launch: Launch) -> None:
        self.cfg, self.out, self.launch = cfg, Path(out_dir), launch
        self.group_size = check_world(cfg, launch.world_size, launch.ranks_per_node)
        self.method = methods.make(cfg.method)
        self.backend = cfg.dist.backend
        if self.backend == "auto":
            self.backend = "nccl" if torch.cuda.is_available() else "gloo"
        self.device = torch.device("cpu")
        if self.backend == "nccl":
            self.device = torch.device("cuda", launch.local_rank)
            torch.cuda.set_device(self.device)
        if not dist.is_initialized():
            dist.init_process_group(
                self.backend,
                rank=launch.rank,
                world_size=launch.world_size,
                timeout=timedelta(seconds=cfg.dist.timeout_s),
            )
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.ledger = ledger.Ledger(
            self.rank, self._node_map(), self.out, cfg.tracking.ledger_rows, self.device
        )
        self.ledger.record("all_gather", 8, None)  # the node map itself
        self.pgs = groups.ProcessGroups()
        self.fanout = groups.fanout(self.rank, self.ledger.nodes, 0, self.pgs)  # rank 0's state
        self.tracker = self._open_tracking()

        self.task = make_task(cfg)
        self.sampler = StepSampler(len(self.task), cfg.batch_size, self.rank, self.world, cfg.seed)
        self.model = models.build(cfg, self.task.classes, self.task.features).to(self.device)
        if cfg.dist.sync_batchnorm != "local":
            batchnorm.convert(self.model)
        self.layers: dict[str, lowrank.LowRankLayer] = {}
        self.groups: groups.ABGroups | None = None
        if self.method.low_rank:
            self.layers = lowrank.convert(self.model, cfg.ab.full_rank_layers)
            self.model.to(self.device)
            plan = self.method.group_plan(self.world, self.group_size)
            self.groups = groups.build(
                self.rank, plan, cfg.ab.sync_mode == "only_learned", self.ledger.nodes, self.pgs
            )
        self.opt = torch.optim.AdamW(
            self.model.parameters(),
            lr=cfg.optim.lr,
            betas=tuple(cfg.optim.betas),
            weight_decay=cfg.optim.weight_decay,
        )
        torch.manual_seed(cfg.seed * 1000 + self.rank)  # per-rank stream for dropout etc.
        self._signalled = False
        self._usr1 = None  # the disposition this run borrows SIGUSR1 from, given back after
        if threading.current_thread() is threading.main_thread():
            self._usr1 = signal.signal(signal.SIGUSR1, self._on_stop_signal)

        self.ddp: DistributedDataParallel | None = None
        self.state = RunState()
        self.fresh = True  # no wrap yet: the first one broadcasts rank 0's state
        self.train_log: list[str] = []  # train_log.csv lines since the last checkpoint
        self._example: torch.Tensor | None = None

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
            self.tracker.finish(status)
            if self._usr1 is not None:
                # Left in place, Python's shutdown would reset our handler to the default
                # action, and a SIGUSR1 arriving then (SLURM's, just as the run stopped at
                # its deadline) would kill a rank that had stopped cleanly; under SLURM the
                # disposition given back is the launcher's "ignore".
                signal.signal(signal.SIGUSR1, self._usr1)

    def _loop(self) -> Iterator[dict[str, Any]]:
        self._resume()
        self._start_tracking()
        started = time.time() - self.state.elapsed
        self._mark = (self.state.step, time.time())  # where the log line's speed counts from
        bar = self._progress_bar()
        batches = self.task.train_batches(self.sampler, self.state.step, self.cfg.steps)
        while self.state.step < self.cfg.steps:
            self.ledger.step = self.state.step
            self._enter(schedule.phase_at(self.state.step, self.cfg))
            if self.state.pending_eval and not self.state.phase.low_rank:
                yield self._evaluate()
            self._train_step(batches)
            self.state.step += 1
            bar.set_postfix_str(self._status, refresh=False)
            bar.update(1)
            self.state.pending_eval |= self.state.step % self.cfg.eval_every == 0
            self.state.elapsed = time.time() - started
            if self.cfg.checkpoint_every and self.state.step % self.cfg.checkpoint_every == 0:
                if self.state.step < self.cfg.steps:
                    self._checkpoint()
        self.ledger.step = self.state.step  # what follows belongs after the last step
        if self.state.phase != DONE:
            self._enter(DONE)  # a run never ends with divergent replicas
            yield self._evaluate()
            self.state.elapsed = time.time() - started
            self._checkpoint()
        bar.close()
        self.summary = self._finish()

    def _enter(self, phase: Phase) -> None:
        """Move the model into `phase`'s representation; re-wrap DDP where needed."""
        if phase == self.state.phase:
            if self.ddp is None:
                self._wrap(init_sync=False)
            return
        prev, self.state.phase = self.state.phase, phase
        if prev is not None and prev.low_rank:  # Algorithm 1, lines 18-21
            t0, self.ledger.phase = self._now(), "sync"
            moments = [
                state[key]
                for p in sync.shared_params(self.model, self.layers)
                if (state := self.opt.state.get(p))
                for key in ("exp_avg", "exp_avg_sq")
            ]
            sync.average(
                self.model, self.layers, self.groups, self.cfg.ab.sync_mode, self.ledger, moments
            )
            sync.merge(self.layers)
            self.state.add_time("comm", self._now() - t0)
        if phase.low_rank:  # lines 10-14
            t0, self.ledger.phase = self._now(), "factorize"
            self._factorize()
            self.state.add_time("svd", self._now() - t0)
        if prev is not None:
            self._adapt_optimizer_state()
        self.ledger.phase = phase.kind
        if phase != DONE:
            self._wrap(init_sync=self.fresh)
        self._log(f"step {self.state.step}: enter {phase.kind} phase")

    def _train_step(self, batches: Iterator[tuple[torch.Tensor, torch.Tensor]]) -> None:
        cfg, run = self.cfg, self.state
        self._fail_if_asked()
        lr = schedule.lr_at(run.step, cfg)
        for g in self.opt.param_groups:
            g["lr"] = lr
        t0 = time.perf_counter()
        x, y = next(batches)  # decoded ahead by the loader's workers
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        t1 = time.perf_counter()
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=cfg.bf16):
            logits = self.ddp(x)
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
            raise TrainingDiverged(
                f"step {run.step} ({run.phase.kind} phase): loss {loss_value:.6g}, gradient "
                f"norm {grad_norm.item():.6g}; not finite, so the run stops before a "
                f"checkpoint of it (optim.lr={cfg.optim.lr:g}; the last checkpoint is "
                "whole)"
            )
        t2 = time.perf_counter()
        waited = min(self.ledger.exposed_allreduce_seconds(), t2 - t1)
        run.add_time("data", t1 - t0)
        run.add_time("compute", t2 - t1 - waited)
        run.add_time("comm", waited)
        run.times[run.phase.kind]["steps"] += 1
        top1 = (logits.argmax(1) == y).float().mean().item() * 100
        run.window = [run.window[0] + loss_value, run.window[1] + top1, run.window[2] + 1]
        run.last_loss = loss_value
        self.train_log.append(
            f"{run.step},{loss_value:.6g},{lr:.6g},{run.phase.kind},{t2 - t0:.4f},{t1 - t0:.4f}"
        )
        sent = self.ledger.sent
        if run.step % cfg.tracking.log_every == 0:
            self.tracker.metrics(
                run.step,
                dict(
                    loss=loss_value,
                    lr=lr,
                    phase=PHASE_IDS[run.phase.kind],
                    inter_node_bytes=sent["inter"],
                    intra_node_bytes=sent["intra"],
                ),
            )
        share = run.time_summary()["share"]
        self._status = (
            f"{run.phase.kind} loss {loss_value:.3f} lr {lr:.1e} "
            f"inter-node {sent['inter'] / 1e6:.1f} MB/rank | time: data {share['data']:.0%} "
            f"comm {share['comm']:.0%} svd {share['svd']:.0%}"
        )
        every = max(1, cfg.steps // 20)
        if not self._tty and (run.step % every == 0 or run.step == cfg.steps - 1):
            self._log(f"step {run.step:>6} {self._status} | {self._speed()}")

    # ---------------------------------------------------------------- the AB pieces
    def _factorize(self) -> None:
        ab = self.cfg.ab
        ranks = sync.factorize(
            self.layers, ab.sigma_cutoff, self.groups.role, self.ledger, ab.split_sigma
        )
        ratio = lowrank.compression_ratio(self.model)
        self.state.factorizations.append(
            dict(step=self.state.step, compression_ratio=ratio, ranks=ranks)
        )
        # per-layer ranks go to a table (ranks.csv), not one chart per layer
        full = {n: min(lowrank.as_matrix(self.layers[n].weight).shape) for n in ranks}
        self.tracker.metrics(
            self.state.step,
            {
                "compression_ratio": ratio,
                "rank_fraction_mean": sum(ranks[n] / full[n] for n in ranks) / len(ranks),
            },
        )
        self.tracker.text(self._ranks_csv(), "ranks.csv")
        k = list(ranks.values())
        self._log(
            f"step {self.state.step}: factorised {len(k)} layers, ranks {min(k)}-{max(k)}, "
            f"compression {ratio:.2f}:1"
        )

    def _adapt_optimizer_state(self) -> None:
        """AdamW's moments across a change of shape: carried (cut or zero-padded) or reset."""
        reset = self.cfg.ab.optimizer_state == "reset"
        for layer in self.layers.values():
            for p in (layer.weight, layer.a, layer.b):
                state = self.opt.state.get(p)
                if not state:
                    continue
                if reset:
                    del self.opt.state[p]
                    continue
                for key in ("exp_avg", "exp_avg_sq"):
                    if state[key].shape != p.shape:
                        state[key] = fit_shape(state[key], p.shape)

    def _wrap(self, init_sync: bool) -> None:
        """DDP over this phase's group: the world, or this rank's A/B group."""
        t0, self.ddp = self._now(), None
        gc.collect()  # the old wrapper's reducer must drop its autograd hooks first
        group = self.groups.group if self.state.phase.low_rank else None
        if init_sync and group is None:
            self._share_state()  # in two hops, not DDP's one broadcast over the world
            init_sync = False
        elif init_sync:  # a run resumed inside an AB phase: DDP's broadcast, in the group
            state = [p for p in self.model.parameters()] + list(self.model.buffers())
            size = sum(t.numel() * t.element_size() for t in state)
            self.ledger.record("broadcast", size, group, root=ledger.group_ranks(group)[0])
        batchnorm.attach(self.model, group, self.ledger, self.cfg.dist.sync_batchnorm)
        self.ddp = DistributedDataParallel(
            self.model,
            device_ids=[self.device.index] if self.device.type == "cuda" else None,
            process_group=group,
            init_sync=init_sync,
            forward_sync_buffers=False,
            gradient_as_bucket_view=True,  # one copy of the gradients, not two
            bucket_cap_mb=self.method.bucket_cap_mb(self.cfg, self.backend),
        )
        self.ddp.register_comm_hook(*self.method.comm_hook(self.cfg, self.ledger, group))
        self.fresh = False
        self.state.add_time("wrap", self._now() - t0)

    @torch.no_grad()
    def _share_state(self) -> None:
        """Rank 0's parameters and buffers to every rank, one dtype at a time."""
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for t in [*self.model.parameters(), *self.model.buffers()]:
            by_dtype.setdefault(t.dtype, []).append(t.data)
        for tensors in by_dtype.values():
            sync.share(tensors, self.ledger, self.fanout)

    # ---------------------------------------------------------------- evaluation
    @torch.no_grad()
    def _evaluate(self) -> dict[str, Any]:
        """Loss, top-1 and top-5 of the one merged model, each rank on its shard."""
        t0, self.ledger.phase, phase = self._now(), "eval", self.ledger.phase
        self.model.eval()
        sums = torch.zeros(4, dtype=torch.float64, device=self.device)  # loss, top1, top5, n
        for x, y in self.task.val_batches(self.rank, self.world, 4 * self.cfg.batch_size):
            if self._example is None:
                self._example = x[:2].float().cpu()  # the logged model's signature
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cfg.bf16):
                logits = self.model(x).float()
            top5 = logits.topk(min(5, logits.shape[1]), dim=1).indices
            sums[0] += F.cross_entropy(logits, y, reduction="sum").double()
            sums[1] += (top5[:, 0] == y).sum()
            sums[2] += (top5 == y[:, None]).any(1).sum()
            sums[3] += len(y)
        self.ledger.all_reduce(sums)
        self.model.train()
        self.ledger.phase = phase
        loss, top1, top5, n = sums.tolist()
        samples = self.state.step * self.sampler.global_batch
        result = dict(
            step=self.state.step,
            val_loss=loss / n,
            val_top1=100 * top1 / n,
            val_top5=100 * top5 / n,
            seconds=self.state.elapsed,  # training time so far, for time-to-accuracy
            samples=samples,  # seen, over all ranks
            epoch=samples / len(self.task),
            # the summary's per-rank traffic as it stood: the last evaluation's figure and
            # the summary's differ only by the final checkpoint's collectives
            inter_node_bytes=self.ledger.sent["inter"],
        )
        loss_sum, top1_sum, n_steps = self.state.window
        if n_steps:
            result["train_loss"], result["train_top1"] = loss_sum / n_steps, top1_sum / n_steps
        self.state.window = [0.0, 0.0, 0.0]
        last = (
            self.state.factorizations[-1]["compression_ratio"] if self.state.factorizations else 1.0
        )
        self.state.evals.append(result)
        self.state.add_time("eval", self._now() - t0)
        times = self.state.time_summary()["share"]
        # inter_node_bytes is a per-step metric already (after the step, not before it)
        # (and step is MLflow's own)
        logged = {
            k: v for k, v in result.items() if k not in ("inter_node_bytes", "samples", "step")
        }
        self.tracker.metrics(
            self.state.step,
            {
                **logged,
                "compression_ratio": last,
                **{f"time_share/{part}": v for part, v in times.items()},
            },
        )
        self.tracker.flush()
        self.state.pending_eval = False
        self._log(
            f"step {self.state.step}: val loss {result['val_loss']:.4f} "
            f"top1 {result['val_top1']:.2f}% top5 {result['val_top5']:.2f}%"
        )
        if not math.isfinite(result["val_loss"]):  # all-reduced: every rank stops together
            raise TrainingDiverged(
                f"validation loss is {result['val_loss']} at step {self.state.step}"
            )
        return result

    # ---------------------------------------------------------------- checkpoints
    @property
    def ckpt_root(self) -> Path:
        return self.out / "checkpoints"

    def _checkpoint(self) -> None:
        t0, self.ledger.phase, phase = self._now(), "checkpoint", self.ledger.phase
        # One all-reduce tells that every rank has saved, and whether any must stop now;
        # it is recorded before the snapshot, so a resumed run's ledger has it too.
        self.ledger.record("all_reduce", 8, None)
        self._flush_logs()
        buffers = {n for n, _ in self.model.named_buffers()}
        model = self.model.state_dict()
        shared = dict(
            model={k: v for k, v in model.items() if k not in buffers},
            optim=self.opt.state_dict(),
        )
        own = dict(
            run=self.state.to_dict(),
            buffers={k: v for k, v in model.items() if k in buffers},
            rng=dict(torch=torch.get_rng_state(), python=random.getstate()),
            ledger=self.ledger.state(),
        )
        own["run"]["run_id"] = self.tracker.run_id or ""
        if self.device.type == "cuda":
            own["rng"]["cuda"] = torch.cuda.get_rng_state(self.device)
        # Ranks that hold one replica write its state once: the world, until the first
        # factorisation; from then on the A/B group, whose factors' AdamW moments (kept
        # through full-rank phases for the next AB phase) are its own.
        group = self.groups.group if self.state.factorizations else None
        writer = ledger.group_ranks(group)[0]
        checkpoint.save(self.ckpt_root, self.state.step, self.rank, writer, shared, own)
        stop = torch.tensor([int(self._stop_requested())], device=self.device)
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if self.rank == 0:
            meta = dict(world_size=self.world, nodes=self._nodes, config=self.cfg.dump())
            checkpoint.publish(self.ckpt_root, self.state.step, self.cfg.keep_checkpoints, meta)
        self.state.add_time("checkpoint", self._now() - t0)
        if stop.item() and self.state.step < self.cfg.steps:
            if self.rank == 0:
                checkpoint.atomic_write_text(self.out / "REQUEUE", f"{self.state.step}\n")
            raise StopForRequeue(
                f"stopped at the checkpoint of step {self.state.step} to be requeued"
            )
        self.ledger.phase = phase
        if self.method.rewrap_at_checkpoint:
            self.ddp = None

    def _flush_logs(self) -> None:
        """Every rank: the ledger's tables since the last checkpoint; rank 0: the train log."""
        self.ledger.flush()
        if self.rank == 0:
            checkpoint.append_lines(self.out / "train_log.csv", self.train_log, TRAIN_LOG_HEADER)
        self.train_log = []

    def _refuse_other_config(self, saved: dict[str, Any], where: Path) -> None:
        """A run folder belongs to one config: resuming under another would mix two runs."""
        differ = checkpoint.diff_keys(saved, self.cfg.dump())
        if differ:
            raise RuntimeError(
                f"{where} holds a run with another config ({', '.join(differ)} differ); "
                "choose a new --out, or delete the folder to start over"
            )

    def _resume(self) -> None:
        saved = self.out / "config.json"
        if saved.exists():
            self._refuse_other_config(json.loads(saved.read_text()), self.out)
        found = self._read_checkpoint()
        if self.rank == 0 and not saved.exists():
            checkpoint.atomic_write_text(saved, json.dumps(self.cfg.dump(), indent=2))
        if found is None:
            return
        step, own, shared = found
        sd = {**shared["model"], **own["buffers"]}
        for name, layer in self.layers.items():  # factors take the saved shapes first
            layer.a.data = torch.empty(
                sd[f"{name}.a"].shape, dtype=layer.a.dtype, device=self.device
            )
            layer.b.data = torch.empty(
                sd[f"{name}.b"].shape, dtype=layer.b.dtype, device=self.device
            )
        self.model.load_state_dict(sd)
        self.state = RunState.from_dict(own["run"])
        if self.state.phase.low_rank:
            for layer in self.layers.values():
                layer.set_factors(layer.a.data, layer.b.data, self.groups.role)
        self.opt.load_state_dict(shared["optim"])
        torch.set_rng_state(own["rng"]["torch"])
        random.setstate(own["rng"]["python"])
        if "cuda" in own["rng"]:
            torch.cuda.set_rng_state(own["rng"]["cuda"], self.device)
        self.ledger.load_state(own["ledger"])
        if self.rank == 0:
            checkpoint.cut_after(self.out / "train_log.csv", step, checkpoint.csv_step, header=True)
        self._resumed_run_id = self.state.run_id or None
        self.fresh = False
        self._log(f"resumed from step {step} ({self.state.phase.kind} phase)")

    def _read_checkpoint(self) -> tuple[int, dict, dict] | None:
        """The newest checkpoint every rank can read (an unreadable file is named and the
        one before it tried); None for a new run. Refuses one of another world or config."""
        candidates = checkpoint.resume_candidates(self.ckpt_root)
        errors = []
        for step in candidates:
            meta = checkpoint.meta(self.ckpt_root, step)
            where = checkpoint.step_dir(self.ckpt_root, step)
            if (meta["world_size"], meta["nodes"]) != (self.world, self._nodes):
                raise RuntimeError(
                    f"{where} was written by {meta['world_size']} ranks on {meta['nodes']} "
                    f"nodes, this run has {self.world} on {self._nodes}: resume with the "
                    "same, or choose a new --out"
                )
            self._refuse_other_config(meta["config"], where)
            try:
                own, shared, error = *checkpoint.load(self.ckpt_root, step, self.rank), ""
            except checkpoint.CheckpointError as err:
                own = shared = None
                error = str(err)
                errors.append(error)
                print(f"[abtrain] rank {self.rank}: {error}", file=sys.stderr, flush=True)
            # All ranks take the same step or none; not in the ledger, whose state is
            # about to come from the checkpoint.
            ok = torch.tensor([0 if error else 1], device=self.device)
            dist.all_reduce(ok, op=dist.ReduceOp.MIN)
            if ok.item():
                if step != candidates[0]:
                    self._log(f"checkpoint of step {candidates[0]} unreadable: using {step}")
                return step, own, shared
        if candidates:
            raise RuntimeError(
                f"no checkpoint in {self.ckpt_root} could be read by every rank "
                f"({'; '.join(errors) or 'another rank named the files'}); "
                "nothing was overwritten"
            )
        return None

    # ---------------------------------------------------------------- results
    def _node_map(self) -> list[int]:
        """Every rank's node, from the launcher; the one collective before the ledger."""
        mine = torch.tensor([self.launch.node], device=self.device)
        nodes = [torch.empty_like(mine) for _ in range(self.world)]
        dist.all_gather(nodes, mine)
        return [int(n) for n in nodes]

    def _finish(self) -> dict[str, Any]:
        """Write summary.json (rank 0) from the ledger's world totals; per-collective rows,
        if kept, are joined into ledger.jsonl one rank's file at a time."""
        self._flush_logs()
        dist.barrier()
        summary: dict[str, Any] = {}
        if self.rank == 0:
            names = ["summary.json", "ledger.csv", "config.json", "model.pt", "train_log.csv"]
            if self.cfg.tracking.ledger_rows:
                names.append(self.ledger.concat_rows(self.world).name)
            if self.state.factorizations:
                checkpoint.atomic_write_text(self.out / "ranks.csv", self._ranks_csv())
                names.append("ranks.csv")
            summary = self._summary()
            checkpoint.atomic_write_text(self.out / "summary.json", json.dumps(summary, indent=2))
            checkpoint.atomic_save(self.model.state_dict(), self.out / "model.pt")
            self.tracker.metrics(self.state.step, final_metrics(summary))
            self.tracker.artifacts([self.out / n for n in names])
            if self.cfg.tracking.log_model and self.tracker.run_id is not None:
                try:
                    self.tracker.model(self._plain_model(), self._example_batch(), self.state.step)
                except Exception as err:  # the run's results are in already: keep them
                    print(
                        f"[abtrain] warning: the model was not logged to MLflow: "
                        f"{type(err).__name__}: {err} (its weights are in {self.out / 'model.pt'})",
                        file=sys.stderr,
                    )
        return summary

    def _ranks_csv(self) -> str:
        """Every factorisation's kept rank per layer, with the layer's matrix shape."""
        out = io.StringIO()
        out.write("step,layer,rank,rows,cols,full_rank,kept_fraction\n")
        for f in self.state.factorizations:
            for name, k in f["ranks"].items():
                rows, cols = lowrank.as_matrix(self.layers[name].weight).shape
                out.write(f"{f['step']},{name},{k},{rows},{cols},{min(rows, cols)},")
                out.write(f"{k / min(rows, cols):.6g}\n")
        return out.getvalue()

    def _plain_model(self) -> torch.nn.Module:
        """The merged full-rank model as the model zoo builds it (plain Linear/Conv layers,
        no factors, no process groups), on the CPU."""
        with torch.random.fork_rng(devices=[]):  # build() seeds the global generator
            plain = models.build(self.cfg, self.task.classes, self.task.features)
        factors = {f"{n}.{p}" for n in self.layers for p in ("a", "b")}
        state = {k: v.cpu() for k, v in self.model.state_dict().items() if k not in factors}
        plain.load_state_dict(state)
        return plain.eval()

    def _example_batch(self) -> torch.Tensor:
        if self._example is None:  # resumed after the last evaluation
            x, _ = next(iter(self.task.val_batches(0, 1, 2)))
            self._example = x[:2].float().cpu()
        return self._example

    def _summary(self) -> dict[str, Any]:
        run = self.state
        tops = [e["val_top1"] for e in run.evals]
        losses = [e["val_loss"] for e in run.evals]
        last = run.factorizations[-1] if run.factorizations else None
        traffic = self.ledger.totals(self.world)
        traffic["inter_node_bytes_per_step"] = traffic["inter_node_bytes"] / self.cfg.steps
        return dict(
            method=self.cfg.method,
            run_name=self.run_name,
            tags=dict(self.cfg.tracking.tags),
            world_size=self.world,
            nodes=self._nodes,
            ranks_per_node=self.launch.ranks_per_node,
            batch_size=self.cfg.batch_size,  # per rank
            global_batch=self.sampler.global_batch,
            steps=self.cfg.steps,
            epochs=self.cfg.steps * self.sampler.global_batch / len(self.task),
            val_top1=dict(best=max(tops), final=tops[-1]),
            val_loss=dict(min=min(losses), final=losses[-1]),
            train_loss_final=run.last_loss,
            compression_ratio=last["compression_ratio"] if last else 1.0,
            ranks=last["ranks"] if last else {},
            factorizations=run.factorizations,
            traffic=traffic,
            time=run.time_summary(),
            wall_seconds=run.elapsed,
            evals=run.evals,
        )

    # ---------------------------------------------------------------- tracking
    def _open_tracking(self) -> Tracker:
        """Rank 0 takes the run folder (one run at a time in it) and opens the store; every
        rank learns whether it could, so all stop alike."""
        tracker, error = Tracker(self.cfg, active=False), ""
        if self.rank == 0:
            self.out.mkdir(parents=True, exist_ok=True)
            # held until this process exits: a second launch into the folder is refused
            self._folder_lock = filelock.FileLock(self.out / ".lock")
            try:
                self._folder_lock.acquire(timeout=0)
            except filelock.Timeout:
                error = f"{self.out} is in use by another run (it holds {self.out / '.lock'})"
        if self.rank == 0 and self.cfg.tracking.enabled and not error:
            try:
                tracker = Tracker(self.cfg, active=True)
            except TrackingError as err:
                error = str(err)
        ok = torch.tensor([0 if error else 1], device=self.device)
        self.ledger.broadcast(ok, src=0)
        if not ok.item():
            raise TrackingError(error or "rank 0 could not take the run folder or reach the store")
        return tracker

    @property
    def run_name(self) -> str:
        """`tracking.run_name`, or one that tells the points of the experiment matrix apart."""
        return run_name_for(self.cfg, self._nodes, self.launch.ranks_per_node)

    def _start_tracking(self) -> None:
        if self.tracker.client is None:
            return
        commit = git_commit()
        tags = dict(
            method=self.cfg.method,
            model=self.cfg.model.name,
            dataset=self.cfg.data.name,
            world_size=self.world,
            nodes=self._nodes,
            ranks_per_node=self.launch.ranks_per_node,
            batch_size=self.cfg.batch_size,
            global_batch=self.sampler.global_batch,
            git_commit=commit,
            out_dir=str(self.out.resolve()),
            **source_tags(commit),
            **self.cfg.tracking.tags,
        )
        resumed = getattr(self, "_resumed_run_id", None)
        self.tracker.start(self.cfg, tags, resumed, self.run_name, self._dataset())

    def _dataset(self) -> dict[str, Any]:
        """The training data as MLflow's input: a prepared folder is named by its folder and
        identified by its meta.json; generated data by its config and seed."""
        d = self.cfg.data
        meta = getattr(self.task, "meta", None)
        if meta is None:
            described = dict(d.model_dump(mode="json"), seed=self.cfg.seed)
            name, source, val = d.name, f"generated (seed {self.cfg.seed})", d.val_samples
        else:
            described = meta
            name, source = Path(d.prepared).name, d.source or f"torchvision {d.name}"
            val = sum(meta["counts"]["val"].values())
        profile = dict(train_samples=len(self.task), val_samples=val, classes=self.task.classes)
        if meta is not None:
            profile["prepared"] = d.prepared
        return dict(name=name, digest=dataset_digest(described), source=source, profile=profile)

    # ---------------------------------------------------------------- helpers
    def _speed(self) -> str:
        """Seconds per step since the last log line, and the time left at that pace."""
        (step0, t0), now = self._mark, time.time()
        done = self.state.step + 1 - step0
        self._mark = (self.state.step + 1, now)
        per_step = (now - t0) / max(done, 1)
        left = per_step * (self.cfg.steps - self.state.step - 1)
        eta = f"{int(left) // 3600}:{int(left) % 3600 // 60:02d}:{int(left) % 60:02d}"
        return f"{per_step:.3f} s/step, ETA {eta}"

    @property
    def _nodes(self) -> int:
        return len(set(self.ledger.nodes))

    @property
    def _tty(self) -> bool:
        return self.rank == 0 and sys.stderr.isatty()

    def _progress_bar(self):
        from tqdm import tqdm

        return tqdm(
            total=self.cfg.steps, initial=self.state.step, disable=not self._tty, unit="step"
        )

    def _now(self) -> float:
        """A clock for the rare, long pieces (syncs, SVDs, evaluations): waits for the device
        first, so their time is not charged to the next step."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _log(self, msg: str) -> None:
        if self.rank == 0:
            print(f"[abtrain] {msg}", flush=True)

    def _on_stop_signal(self, *_: object) -> None:
        self._signalled = True  # acted on at the next checkpoint, by all ranks together

    def _stop_requested(self) -> bool:
        deadline = os.environ.get("ABTRAIN_DEADLINE", "")
        return self._signalled or (deadline.isdigit() and time.time() > int(deadline))

    def _fail_if_asked(self) -> None:
        """Fault injection for tests: ABTRAIN_FAIL_AT=rank:step kills that rank there, in a
        run that started afresh on torchrun's first attempt only: a failure that came back
        after every restart would only use up `--max-restarts`. (Under the c10d rendezvous a
        node whose ranks restart because another one failed keeps its count at 0, and node
        ranks are dealt anew, so the count alone can't tell; a resumed run can.)"""
        spec = os.environ.get("ABTRAIN_FAIL_AT", "")
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        resumed = hasattr(self, "_resumed_run_id")  # set by _resume, and only there
        if spec and first_attempt and not resumed and spec == f"{self.rank}:{self.state.step}":
            print(
                f"[abtrain] rank {self.rank}: injected failure at step {self.state.step}",
                file=sys.stderr,
                flush=True,
            )
            os._exit(13)
