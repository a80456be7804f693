"""A run's checkpoints as the trainer sees them: what a step's state is (model, AdamW,
run record, RNG, ledger totals), saving it, and resuming from the newest one every rank can
read, bit for bit. The run folder belongs to one run (a second launch is refused) and one
config (a resume under another is refused, naming the keys). The files themselves, their
layout and checksums, are `checkpoint`'s."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import filelock
import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from abtrain.abtraining import ABTraining

from abtrain import checkpoint
from abtrain.config import Config, diff_keys, training_diff
from abtrain.files import atomic_write_text
from abtrain.runstate import RunState


def take_folder(out: Path) -> tuple[filelock.FileLock | None, str]:
    """Rank 0: the run folder's lock, held until this process exits, so that a second
    launch into the folder is refused; or the error saying who holds it."""
    out.mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(out / ".lock")
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        return None, f"{out} is in use by another run (it holds {out / '.lock'})"
    return lock, ""


class Checkpointer:
    def __init__(
        self, out: Path, cfg: Config, rank: int, world: int, nodes: int, device: torch.device
    ) -> None:
        self.out, self.cfg, self.rank, self.world, self.nodes = out, cfg, rank, world, nodes
        self.device = device
        self.root = out / "checkpoints"

    def save(
        self,
        step: int,
        model: torch.nn.Module,
        opt: torch.optim.Optimizer,
        run: RunState,
        method: ABTraining,
        run_id: str,
        writer: int,
    ) -> None:
        """This rank's part of the checkpoint of `step`; `writer` is the first rank of the
        replica whose shared state (parameters, AdamW) it writes once."""
        buffers = {n for n, _ in model.named_buffers()}
        state = model.state_dict()
        shared = dict(
            model={k: v for k, v in state.items() if k not in buffers},
            optim=opt.state_dict(),
        )
        own = dict(
            run=run.to_dict(),
            buffers={k: v for k, v in state.items() if k in buffers},
            rng=dict(torch=torch.get_rng_state(), python=random.getstate()),
            method=method.state_dict(),  # phase, factorisations, factor shapes, ledger
        )
        own["run"]["run_id"] = run_id
        if self.device.type == "cuda":
            own["rng"]["cuda"] = torch.cuda.get_rng_state(self.device)
        checkpoint.save(self.root, step, self.rank, writer, shared, own)

    def publish(self, step: int) -> None:
        """Rank 0, once every rank has saved: the checkpoint of `step` is the one to resume
        from."""
        meta = dict(world_size=self.world, nodes=self.nodes, config=self.cfg.dump())
        checkpoint.publish(self.root, step, self.cfg.keep_checkpoints, meta)

    def resume(
        self, model: torch.nn.Module, opt: torch.optim.Optimizer, method: ABTraining
    ) -> tuple[int, RunState] | None:
        """Load the newest whole checkpoint into `method` (its phase, factor shapes and
        ledger), `model`, `opt` and the RNGs; returns its step and run state, or None for a
        new run (whose config is recorded)."""
        saved = self.out / "config.json"
        was = json.loads(saved.read_text()) if saved.exists() else None
        if was is not None:
            self._refuse_other_config(was, self.out)
        found = self._newest_readable()
        if self.rank == 0 and was != self.cfg.dump():  # new, or other settings of NOT_TRAINING
            if was is not None:
                print(
                    f"[abtrain] resuming with other {', '.join(diff_keys(was, self.cfg.dump()))}"
                    " (they change nothing trained)",
                    flush=True,
                )
            atomic_write_text(saved, json.dumps(self.cfg.dump(), indent=2))
        if found is None:
            return None
        step, own, shared = found
        method.load_state_dict(own["method"])  # factors take the saved shapes first
        model.load_state_dict({**shared["model"], **own["buffers"]})
        opt.load_state_dict(shared["optim"])
        torch.set_rng_state(own["rng"]["torch"])
        random.setstate(own["rng"]["python"])
        if "cuda" in own["rng"]:
            torch.cuda.set_rng_state(own["rng"]["cuda"], self.device)
        return step, RunState.from_dict(own["run"])

    def _refuse_other_config(self, saved: dict[str, Any], where: Path) -> None:
        """A run folder belongs to one config: resuming under another would mix two runs
        (settings that change nothing trained, config.NOT_TRAINING, may differ)."""
        differ = training_diff(saved, self.cfg.dump())
        if differ:
            raise RuntimeError(
                f"{where} holds a run with another config ({', '.join(differ)} differ); "
                "choose a new --out, or delete the folder to start over"
            )

    def _newest_readable(self) -> tuple[int, dict, dict] | None:
        """The newest checkpoint every rank can read (an unreadable file is named and the
        one before it tried); None for a new run. Refuses one of another world or config."""
        candidates = checkpoint.resume_candidates(self.root)
        errors = []
        for step in candidates:
            meta = checkpoint.meta(self.root, step)
            where = checkpoint.step_dir(self.root, step)
            if (meta["world_size"], meta["nodes"]) != (self.world, self.nodes):
                raise RuntimeError(
                    f"{where} was written by {meta['world_size']} ranks on {meta['nodes']} "
                    f"nodes, this run has {self.world} on {self.nodes}: resume with the "
                    "same, or choose a new --out"
                )
            self._refuse_other_config(meta["config"], where)
            try:
                own, shared, error = *checkpoint.load(self.root, step, self.rank), ""
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
                if step != candidates[0] and self.rank == 0:
                    print(
                        f"[abtrain] checkpoint of step {candidates[0]} unreadable: using {step}",
                        flush=True,
                    )
                return step, own, shared
        if candidates:
            raise RuntimeError(
                f"no checkpoint in {self.root} could be read by every rank "
                f"({'; '.join(errors) or 'another rank named the files'}); "
                "nothing was overwritten"
            )
        return None
