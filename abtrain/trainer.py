"""The training loop: Algorithm 1 of the paper, read top to bottom in `Trainer.run`.

Warm-up (full-rank DDP over the world) → repeat { factorise every W into A·B, each group
trains its factor with DDP inside the group → average A and B over the world, W = A·B →
full-rank rebound with DDP over the world } until `steps`. The run always ends merged and
full-rank; validation always sees that one merged model. DDP and PowerSGD run the same
loop with a single full-rank phase.
"""

from __future__ import annotations

import gc
import json
import math
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from abtrain import checkpoint, groups, ledger, lowrank, methods, models, schedule, sync
from abtrain.config import Config, check_world
from abtrain.data import StepSampler, make_task
from abtrain.schedule import PHASE_IDS, Phase
from abtrain.tracking import Tracker, TrackingError, git_commit

DONE = Phase("done")


class TrainingDiverged(RuntimeError):
    """The merged model's validation loss is not finite."""


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
        self.ledger = ledger.Ledger(self.rank, self._node_map())
        self.ledger.record("all_gather", 8, None)  # the node map itself
        self.tracker = self._open_tracking()

        self.task = make_task(cfg)
        self.sampler = StepSampler(len(self.task), cfg.batch_size, self.rank, self.world, cfg.seed)
        self.model = models.build(cfg, self.task.classes, self.task.features).to(self.device)
        self.layers: dict[str, lowrank.LowRankLayer] = {}
        self.groups: groups.ABGroups | None = None
        if self.method.low_rank:
            self.layers = lowrank.convert(self.model, cfg.ab.full_rank_layers)
            self.model.to(self.device)
            plan = self.method.group_plan(self.world, self.group_size)
            self.groups = groups.build(self.rank, plan, cfg.ab.sync_mode == "only_learned")
        self.opt = torch.optim.AdamW(
            self.model.parameters(),
            lr=cfg.optim.lr,
            betas=tuple(cfg.optim.betas),
            weight_decay=cfg.optim.weight_decay,
        )
        torch.manual_seed(cfg.seed * 1000 + self.rank)  # per-rank stream for dropout etc.
        self._signalled = False
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGUSR1, self._on_stop_signal)

        self.ddp: DistributedDataParallel | None = None
        self.phase: Phase | None = None  # the representation the model is in now
        self.step = 0
        self.fresh = True  # no wrap yet: the first one broadcasts rank 0's state
        self.pending_eval = False
        self.train_log: list[dict[str, Any]] = []
        self.evals: list[dict[str, Any]] = []
        self.factorizations: list[dict[str, Any]] = []
        self.elapsed = 0.0
        self.window: list[tuple[float, float]] = []  # (loss, top1) since the last evaluation

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

    def _loop(self) -> Iterator[dict[str, Any]]:
        self._resume()
        self._start_tracking()
        started = time.time() - self.elapsed
        bar = self._progress_bar()
        while self.step < self.cfg.steps:
            self.ledger.step = self.step
            t0 = time.perf_counter()
            self._enter(schedule.phase_at(self.step, self.cfg))
            self._enter_seconds = time.perf_counter() - t0  # SVDs, syncs, re-wrapping
            if self.pending_eval and not self.phase.low_rank:
                yield self._evaluate()
            self._train_step()
            self.step += 1
            bar.set_postfix_str(self._status, refresh=False)
            bar.update(1)
            self.pending_eval |= self.step % self.cfg.eval_every == 0
            self.elapsed = time.time() - started
            if self.cfg.checkpoint_every and self.step % self.cfg.checkpoint_every == 0:
                if self.step < self.cfg.steps:
                    self._checkpoint()
        if self.phase != DONE:
            self._enter(DONE)  # a run never ends with divergent replicas
            yield self._evaluate()
            self.elapsed = time.time() - started
            self._checkpoint()
        bar.close()
        self.summary = self._finish()

    def _enter(self, phase: Phase) -> None:
        """Move the model into `phase`'s representation; re-wrap DDP where needed."""
        if phase == self.phase:
            if self.ddp is None:
                self._wrap(init_sync=False)
            return
        prev, self.phase = self.phase, phase
        if prev is not None and prev.low_rank:  # Algorithm 1, lines 18-21
            self.ledger.phase = "sync"
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
        if phase.low_rank:  # lines 10-14
            self.ledger.phase = "factorize"
            self._factorize()
        if prev is not None:
            self._adapt_optimizer_state()
        self.ledger.phase = phase.kind
        if phase != DONE:
            self._wrap(init_sync=self.fresh)
        self._log(f"step {self.step}: enter {phase.kind} phase")

    def _train_step(self) -> None:
        cfg, t0 = self.cfg, time.perf_counter()
        self._fail_if_asked()
        lr = schedule.lr_at(self.step, cfg)
        for g in self.opt.param_groups:
            g["lr"] = lr
        x, y = (t.to(self.device) for t in self.task.train_batch(self.sampler, self.step))
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=cfg.bf16):
            logits = self.ddp(x)
        loss = F.cross_entropy(logits.float(), y, label_smoothing=cfg.optim.label_smoothing)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.optim.max_grad_norm > 0:
            trainable = [p for p in self.model.parameters() if p.requires_grad]
            torch.nn.utils.clip_grad_norm_(trainable, cfg.optim.max_grad_norm)
        self.opt.step()
        seconds = time.perf_counter() - t0 + self._enter_seconds
        entry = dict(
            step=self.step, loss=loss.item(), lr=lr, phase=self.phase.kind, seconds=seconds
        )
        self.train_log.append(entry)
        top1 = (logits.argmax(1) == y).float().mean().item() * 100
        self.window.append((entry["loss"], top1))
        sent = self.ledger.sent
        if self.step % cfg.tracking.log_every == 0:
            self.tracker.metrics(
                self.step,
                dict(
                    loss=entry["loss"],
                    lr=lr,
                    phase=PHASE_IDS[self.phase.kind],
                    inter_node_bytes=sent["inter"],
                    intra_node_bytes=sent["intra"],
                ),
            )
        self._status = (
            f"{self.phase.kind} loss {entry['loss']:.3f} lr {lr:.1e} "
            f"inter-node {sent['inter'] / 1e6:.1f} MB/rank"
        )
        every = max(1, cfg.steps // 20)
        if not self._tty and (self.step % every == 0 or self.step == cfg.steps - 1):
            self._log(f"step {self.step:>6} {self._status}")

    # ---------------------------------------------------------------- the AB pieces
    def _factorize(self) -> None:
        ranks = sync.factorize(self.layers, self.cfg.ab.sigma_cutoff, self.groups.role, self.ledger)
        ratio = lowrank.compression_ratio(self.model)
        self.factorizations.append(dict(step=self.step, compression_ratio=ratio, ranks=ranks))
        self.tracker.metrics(
            self.step, {"compression_ratio": ratio, **{f"rank/{n}": k for n, k in ranks.items()}}
        )
        k = list(ranks.values())
        self._log(
            f"step {self.step}: factorised {len(k)} layers, ranks {min(k)}-{max(k)}, "
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
        self.ddp = None
        gc.collect()  # the old wrapper's reducer must drop its autograd hooks first
        group = self.groups.group if self.phase.low_rank else None
        if init_sync:
            state = [p for p in self.model.parameters()] + list(self.model.buffers())
            size = sum(t.numel() * t.element_size() for t in state)
            self.ledger.record("broadcast", size, group, root=ledger.group_ranks(group)[0])
        self.ddp = DistributedDataParallel(
            self.model,
            device_ids=[self.device.index] if self.device.type == "cuda" else None,
            process_group=group,
            init_sync=init_sync,
            forward_sync_buffers=False,
            bucket_cap_mb=self.method.bucket_cap_mb(self.cfg, self.backend),
        )
        self.ddp.register_comm_hook(*self.method.comm_hook(self.cfg, self.ledger, group))
        self.fresh = False

    # ---------------------------------------------------------------- evaluation
    @torch.no_grad()
    def _evaluate(self) -> dict[str, Any]:
        """Loss, top-1 and top-5 of the one merged model, each rank on its shard."""
        self.ledger.phase, phase = "eval", self.ledger.phase
        self.model.eval()
        sums = torch.zeros(4, dtype=torch.float64, device=self.device)  # loss, top1, top5, n
        for x, y in self.task.val_batches(self.rank, self.world, 4 * self.cfg.batch_size):
            x, y = x.to(self.device), y.to(self.device)
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
        result = dict(
            step=self.step,
            val_loss=loss / n,
            val_top1=100 * top1 / n,
            val_top5=100 * top5 / n,
            seconds=self.elapsed,  # training time so far, for time-to-accuracy
        )
        if self.window:
            result["train_loss"] = sum(w[0] for w in self.window) / len(self.window)
            result["train_top1"] = sum(w[1] for w in self.window) / len(self.window)
        self.window = []
        last = self.factorizations[-1]["compression_ratio"] if self.factorizations else 1.0
        self.evals.append(result)
        self.tracker.metrics(
            self.step, {**result, "compression_ratio": last, "epoch": len(self.evals)}
        )
        self.tracker.flush()
        self.pending_eval = False
        self._log(
            f"step {self.step}: val loss {result['val_loss']:.4f} "
            f"top1 {result['val_top1']:.2f}% top5 {result['val_top5']:.2f}%"
        )
        if not math.isfinite(result["val_loss"]):  # all-reduced: every rank stops together
            raise TrainingDiverged(f"validation loss is {result['val_loss']} at step {self.step}")
        return result

    # ---------------------------------------------------------------- checkpoints
    @property
    def ckpt_root(self) -> Path:
        return self.out / "checkpoints"

    def _checkpoint(self) -> None:
        self.ledger.phase, phase = "checkpoint", self.ledger.phase
        # One all-reduce tells that every rank has saved, and whether any must stop now;
        # it is recorded before the snapshot, so a resumed run's ledger has it too.
        self.ledger.record("all_reduce", 8, None)
        state = dict(
            step=self.step,
            phase=asdict(self.phase),
            pending_eval=self.pending_eval,
            model=self.model.state_dict(),
            optim=self.opt.state_dict(),
            rng=dict(torch=torch.get_rng_state(), python=random.getstate()),
            ledger=self.ledger.state(),
            train_log=self.train_log,
            evals=self.evals,
            factorizations=self.factorizations,
            elapsed=self.elapsed,
            window=self.window,
            run_id=self.tracker.run_id or "",
        )
        if self.device.type == "cuda":
            state["rng"]["cuda"] = torch.cuda.get_rng_state(self.device)
        checkpoint.save_rank(self.ckpt_root, self.step, self.rank, state)
        stop = torch.tensor([int(self._stop_requested())], device=self.device)
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if self.rank == 0:
            checkpoint.publish(self.ckpt_root, self.step, self.cfg.keep_checkpoints)
        if stop.item() and self.step < self.cfg.steps:
            if self.rank == 0:
                checkpoint.atomic_write_text(self.out / "REQUEUE", f"{self.step}\n")
            raise StopForRequeue(f"stopped at the checkpoint of step {self.step} to be requeued")
        self.ledger.phase = phase
        if self.method.rewrap_at_checkpoint:
            self.ddp = None

    def _check_run_folder(self) -> None:
        """A run folder belongs to one config: resuming under another would mix two runs."""
        saved, mine = self.out / "config.json", self.cfg.dump()
        if saved.exists():
            differ = checkpoint.diff_keys(json.loads(saved.read_text()), mine)
            if differ:
                raise RuntimeError(
                    f"{self.out} holds a run with another config ({', '.join(differ)} differ); "
                    "choose a new --out, or delete the folder to start over"
                )
        elif self.rank == 0:
            checkpoint.atomic_write_text(saved, json.dumps(mine, indent=2))

    def _resume(self) -> None:
        self._check_run_folder()
        step = checkpoint.latest_step(self.ckpt_root)
        if step is None:
            return
        state = checkpoint.load_rank(self.ckpt_root, step, self.rank)
        sd = state["model"]
        for name, layer in self.layers.items():  # factors take the saved shapes first
            layer.a.data = torch.empty(
                sd[f"{name}.a"].shape, dtype=layer.a.dtype, device=self.device
            )
            layer.b.data = torch.empty(
                sd[f"{name}.b"].shape, dtype=layer.b.dtype, device=self.device
            )
        self.model.load_state_dict(sd)
        self.phase = Phase(**state["phase"])
        if self.phase.low_rank:
            for layer in self.layers.values():
                layer.set_factors(layer.a.data, layer.b.data, self.groups.role)
        self.opt.load_state_dict(state["optim"])
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        if "cuda" in state["rng"]:
            torch.cuda.set_rng_state(state["rng"]["cuda"], self.device)
        self.ledger.load_state(state["ledger"])
        self.step, self.pending_eval = state["step"], state["pending_eval"]
        self.train_log, self.evals = state["train_log"], state["evals"]
        self.factorizations, self.elapsed = state["factorizations"], state["elapsed"]
        self.window, self._resumed_run_id = state["window"], state["run_id"] or None
        self.fresh = False
        self._log(f"resumed from step {step} ({self.phase.kind} phase)")

    # ---------------------------------------------------------------- results
    def _node_map(self) -> list[int]:
        """Every rank's node, from the launcher; the one collective before the ledger."""
        mine = torch.tensor([self.launch.node], device=self.device)
        nodes = [torch.empty_like(mine) for _ in range(self.world)]
        dist.all_gather(nodes, mine)
        return [int(n) for n in nodes]

    def _finish(self) -> dict[str, Any]:
        """Write ledger.jsonl and summary.json (rank 0) from every rank's ledger."""
        part = self.out / "ledger" / f"rank_{self.rank}.jsonl"
        self.ledger.phase = "report"
        self.ledger.record("barrier", 0, None)
        ledger.write(part, self.ledger.rows)
        dist.barrier()
        summary: dict[str, Any] = {}
        if self.rank == 0:
            rows = []
            for r in range(self.world):
                rows += ledger.read(self.out / "ledger" / f"rank_{r}.jsonl")
            ledger.write(self.out / "ledger.jsonl", rows)
            summary = self._summary(rows)
            checkpoint.atomic_write_text(self.out / "summary.json", json.dumps(summary, indent=2))
            checkpoint.atomic_save(self.model.state_dict(), self.out / "model.pt")
            lines = ["step,loss,lr,phase,seconds"] + [
                f"{e['step']},{e['loss']:.6g},{e['lr']:.6g},{e['phase']},{e['seconds']:.4f}"
                for e in self.train_log
            ]
            checkpoint.atomic_write_text(self.out / "train_log.csv", "\n".join(lines) + "\n")
            names = ["summary.json", "ledger.jsonl", "config.json", "model.pt", "train_log.csv"]
            self.tracker.artifacts([self.out / n for n in names])
        return summary

    def _summary(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        tops = [e["val_top1"] for e in self.evals]
        losses = [e["val_loss"] for e in self.evals]
        last = self.factorizations[-1] if self.factorizations else None
        return dict(
            method=self.cfg.method,
            world_size=self.world,
            nodes=len(set(self.ledger.nodes)),
            steps=self.cfg.steps,
            val_top1=dict(best=max(tops), final=tops[-1]),
            val_loss=dict(min=min(losses), final=losses[-1]),
            train_loss_final=self.train_log[-1]["loss"] if self.train_log else None,
            compression_ratio=last["compression_ratio"] if last else 1.0,
            ranks=last["ranks"] if last else {},
            factorizations=self.factorizations,
            traffic=ledger.totals(rows, self.world),
            wall_seconds=self.elapsed,
            evals=self.evals,
        )

    # ---------------------------------------------------------------- tracking
    def _open_tracking(self) -> Tracker:
        """Rank 0 opens the store; every rank learns whether it could, so all stop alike."""
        tracker, error = Tracker(self.cfg, active=False), ""
        if self.rank == 0 and self.cfg.tracking.enabled:
            try:
                tracker = Tracker(self.cfg, active=True)
            except TrackingError as err:
                error = str(err)
        ok = torch.tensor([0 if error else 1], device=self.device)
        self.ledger.broadcast(ok, src=0)
        if not ok.item():
            raise TrackingError(error or "rank 0 could not reach the tracking store")
        return tracker

    def _start_tracking(self) -> None:
        tags = dict(
            method=self.cfg.method,
            model=self.cfg.model.name,
            dataset=self.cfg.data.name,
            world_size=self.world,
            nodes=len(set(self.ledger.nodes)),
            git_commit=git_commit(),
            out_dir=str(self.out.resolve()),
        )
        name = f"{self.cfg.method}-{self.cfg.model.name}-{self.cfg.data.name}-{self.world}r"
        self.tracker.start(self.cfg, tags, getattr(self, "_resumed_run_id", None), name)

    # ---------------------------------------------------------------- helpers
    @property
    def _tty(self) -> bool:
        return self.rank == 0 and sys.stderr.isatty()

    def _progress_bar(self):
        from tqdm import tqdm

        return tqdm(total=self.cfg.steps, initial=self.step, disable=not self._tty, unit="step")

    def _log(self, msg: str) -> None:
        if self.rank == 0:
            print(f"[abtrain] {msg}", flush=True)

    def _on_stop_signal(self, *_: object) -> None:
        self._signalled = True  # acted on at the next checkpoint, by all ranks together

    def _stop_requested(self) -> bool:
        deadline = os.environ.get("ABTRAIN_DEADLINE", "")
        return self._signalled or (deadline.isdigit() and time.time() > int(deadline))

    def _fail_if_asked(self) -> None:
        """Fault injection for tests: ABTRAIN_FAIL_AT=rank:step kills that rank there."""
        spec = os.environ.get("ABTRAIN_FAIL_AT", "")
        if spec and spec == f"{self.rank}:{self.step}":
            print(
                f"[abtrain] rank {self.rank}: injected failure at step {self.step}",
                file=sys.stderr,
                flush=True,
            )
            os._exit(13)
