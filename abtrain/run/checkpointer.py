"""A run's checkpoints: what a step's state is (model, AdamW, run record, RNG, ledger
totals), its files, saving it, and resuming from the newest one every rank can read, bit for
bit.

A checkpoint writes each distinct state once. The ranks that hold one replica (the world
in full-rank phases, one A/B group in AB phases) share `step_N/replica_W.pt`, model
parameters and optimizer state, written by the replica's first rank W; every rank adds its
own small `step_N/rank_R.pt`: run state, RNG, ledger totals and its model buffers (which
may differ per rank, as BatchNorm statistics do). Rank 0 points `LATEST` at the folder
after every rank has finished, so a run killed at any moment resumes from a whole one; each
file's sha256 is recorded as it is written and checked as it is read. A resume under
another world size or config is refused, naming what differs.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from abtrain.config import Config, diff_keys, training_diff
from abtrain.files import atomic_write_text, write_failed, write_record
from abtrain.run.runstate import RunState

if TYPE_CHECKING:
    from abtrain.method.abtraining import ABTraining


class _Hashing(io.RawIOBase):
    """A writable file that hashes what passes through it: the digest of the bytes on
    disk without reading them back."""

    def __init__(self, f: io.BufferedWriter) -> None:
        self.f, self.sha = f, hashlib.sha256()
        self.error: OSError | None = None  # torch reports a failed write as its own error

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        self.sha.update(b)
        try:
            return self.f.write(b)
        except OSError as err:
            self.error = err
            raise


def atomic_save(obj: Any, path: Path) -> str:
    """torch.save via a temporary file, fsync and rename; returns the file's sha256. A write
    that fails (a full disk) leaves no temporary file and names the file and the cause."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    out = None
    try:
        with open(tmp, "wb") as f:
            out = _Hashing(f)
            torch.save(obj, out)
            f.flush()
            os.fsync(f.fileno())
    except (OSError, RuntimeError) as err:
        tmp.unlink(missing_ok=True)
        cause = out.error if out is not None and out.error is not None else err
        if not isinstance(cause, OSError):  # torch's own failure, not the disk's
            raise CheckpointError(f"could not write {path}: {cause}") from None
        raise CheckpointError(
            f"{write_failed(cause, path).strerror}; the checkpoints before it are whole"
        ) from None
    os.replace(tmp, path)
    return out.sha.hexdigest()


COMPLETE = "meta.json"  # in a step folder: every rank saved it; world and config


def step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:08d}"


SUMS = ".sha256"  # beside each file, its digest as written; meta.json gathers them


def save(root: Path, step: int, rank: int, writer: int, shared: dict, own: dict) -> None:
    """This rank's part of a checkpoint; `writer` is the first rank of its replica."""
    folder = step_dir(root, step)
    files = {f"rank_{rank}.pt": {**own, "replica": writer}}
    if rank == writer:
        files[f"replica_{writer}.pt"] = shared
    for name, obj in files.items():
        atomic_write_text(folder / (name + SUMS), atomic_save(obj, folder / name))


def publish(root: Path, step: int, keep: int, meta: dict[str, Any]) -> None:
    """Rank 0, once every rank has saved `step`: mark it whole (with `meta`: who wrote it,
    under which config, and every file's sha256, so a resume can tell a file damaged on
    disk since), make it the one to resume from, and drop the older ones beyond the `keep`
    newest whole ones. Folders of later steps (a run restarted from an earlier checkpoint)
    are left to be overwritten."""
    folder = step_dir(root, step)
    sidecars = sorted(folder.glob("*" + SUMS))
    sums = {f.name.removesuffix(SUMS): f.read_text() for f in sidecars}
    write_record(folder / COMPLETE, {"step": step, **meta, "sha256": sums}, indent=None)
    for f in sidecars:  # gathered: meta.json now holds them
        f.unlink()
    atomic_write_text(root / "LATEST", f"{step}\n")
    kept = set([s for s in whole_steps(root) if s <= step][-keep:])
    for folder, s in _step_dirs(root):
        if s < step and s not in kept:
            shutil.rmtree(folder, ignore_errors=True)


def whole_steps(root: Path) -> list[int]:
    """Steps whose checkpoint every rank finished, oldest first."""
    return [s for folder, s in _step_dirs(root) if (folder / COMPLETE).exists()]


def resume_candidates(root: Path) -> list[int]:
    """Steps to resume from, best first: the one `LATEST` names, then every other whole
    one, newest first (a lost or corrupt `LATEST` costs nothing that was saved)."""
    whole = whole_steps(root)[::-1]
    marker = root / "LATEST"
    text = marker.read_text().strip() if marker.exists() else ""
    named = [int(text)] if text.isdigit() and int(text) in whole else []
    return named + [s for s in whole if s not in named]


def step_meta(root: Path, step: int) -> dict[str, Any]:
    return json.loads((step_dir(root, step) / COMPLETE).read_text())


def _step_dirs(root: Path) -> list[tuple[Path, int]]:
    found = []
    for folder in root.glob("step_*"):
        digits = folder.name.removeprefix("step_")
        if folder.is_dir() and digits.isdigit():
            found.append((folder, int(digits)))
    return sorted(found, key=lambda t: t[1])


def load(root: Path, step: int, rank: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(this rank's own state, its replica's shared state) of the checkpoint at `step`,
    each file checked against the sha256 recorded when the checkpoint was published."""
    sums = step_meta(root, step).get("sha256", {})
    own = _load(step_dir(root, step) / f"rank_{rank}.pt", sums)
    shared = _load(step_dir(root, step) / f"replica_{own['replica']}.pt", sums)
    return own, shared


def model_state(root: Path, step: int, rank: int) -> dict[str, Any]:
    """The model's full state_dict as `rank` held it at `step`."""
    own, shared = load(root, step, rank)
    return {**shared["model"], **own["buffers"]}


class CheckpointError(RuntimeError):
    """A checkpoint file is missing or unreadable; the message names it."""


def _load(path: Path, sums: dict[str, str]) -> dict[str, Any]:
    if not path.exists():
        raise CheckpointError(
            f"{path} is missing: the checkpoint was written by a different world size "
            "or has been removed"
        )
    data = path.read_bytes()
    want = sums.get(path.name)
    if want is not None and hashlib.sha256(data).hexdigest() != want:
        # torch.load reads damaged tensor bytes without a word
        raise CheckpointError(
            f"{path} is damaged: its sha256 differs from the one recorded when the "
            "checkpoint was published"
        )
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as err:  # truncated, or not a checkpoint at all
        raise CheckpointError(f"{path} is unreadable ({type(err).__name__}: {err})") from None


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
            # DiLoCo's outer weights and momentum: every rank's are the same, one copy
            outer=method.outer.state_dict() if method.outer else None,
        )
        own = dict(
            run=run.to_dict(),
            buffers={k: v for k, v in state.items() if k in buffers},
            rng=dict(torch=torch.get_rng_state(), python=random.getstate()),
            method=method.state_dict(outer=False),  # phase, factorisations, shapes, ledger
        )
        own["run"]["run_id"] = run_id
        if self.device.type == "cuda":
            own["rng"]["cuda"] = torch.cuda.get_rng_state(self.device)
        save(self.root, step, self.rank, writer, shared, own)

    def publish(self, step: int) -> None:
        """Rank 0, once every rank has saved: the checkpoint of `step` is the one to resume
        from."""
        meta = dict(world_size=self.world, nodes=self.nodes, config=self.cfg.dump())
        publish(self.root, step, self.cfg.keep_checkpoints, meta)

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
            write_record(saved, self.cfg.dump())
        if found is None:
            return None
        step, own, shared = found
        method.load_state_dict(own["method"])  # factors take the saved shapes first
        if method.outer is not None:
            method.outer.load_state_dict(shared["outer"])
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
        candidates = resume_candidates(self.root)
        errors = []
        for step in candidates:
            meta = step_meta(self.root, step)
            where = step_dir(self.root, step)
            if (meta["world_size"], meta["nodes"]) != (self.world, self.nodes):
                raise RuntimeError(
                    f"{where} was written by {meta['world_size']} ranks on {meta['nodes']} "
                    f"nodes, this run has {self.world} on {self.nodes}: resume with the "
                    "same, or choose a new --out"
                )
            self._refuse_other_config(meta["config"], where)
            try:
                own, shared, error = *load(self.root, step, self.rank), ""
            except CheckpointError as err:
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
