"""What a run leaves in its folder besides checkpoints: the per-step train log (written at
each checkpoint, cut back on resume), the per-layer ranks table, summary.json, the final
model, and the figures MLflow gets at the end."""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Any

import torch

from abtrain import models
from abtrain.config import Config
from abtrain.distributed.ledger import Ledger
from abtrain.files import append_lines, atomic_write_text, csv_step, cut_after, write_record
from abtrain.method import lowrank
from abtrain.run.checkpointer import atomic_save
from abtrain.run.progress import Progress
from abtrain.run.runstate import RunState
from abtrain.tracking.tracker import Tracker

TRAIN_LOG_HEADER = "step,loss,lr,phase,seconds,data_seconds"


class TrainLog:
    """`train_log.csv`, one line per step: kept in memory between checkpoints, appended by
    rank 0 at each one; a resume cuts the lines after its checkpoint (and a torn one)."""

    def __init__(self, out: Path, rank: int) -> None:
        self.path, self.rank = out / "train_log.csv", rank
        self.lines: list[str] = []

    def add(self, step: int, loss: float, lr: float, phase: str, seconds: float, data: float):
        self.lines.append(f"{step},{loss:.6g},{lr:.6g},{phase},{seconds:.4f},{data:.4f}")

    def flush(self) -> None:
        if self.rank == 0:
            append_lines(self.path, self.lines, TRAIN_LOG_HEADER)
        self.lines = []

    def cut_after(self, step: int) -> None:
        if self.rank == 0:
            cut_after(self.path, step, csv_step, header=True)


def final_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """The run's figures as summary.json holds them, logged at the last step so that MLflow
    and summary.json agree to the bit. The headline ones go under `final/` (the key figures
    a table shows first, rounded, are abtrain.tracking.views's); the rest are the last point of
    the running series. The headline ones are rounded as a table shows them (the
    Key figures view prints every digit MLflow holds); the exact values are the series'."""
    t = summary["traffic"]
    return {
        "final/inter_node_mb_per_step": round(t["inter_node_bytes_per_step"] / 1e6, 3),
        "final/val_top1_best": summary["val_top1"]["best"],
        "final/val_top1_final": summary["val_top1"]["final"],
        "final/compression_ratio": round(summary["compression_ratio"], 3),
        "final/wall_seconds": round(summary["wall_seconds"], 1),
        "inter_node_bytes": t["inter_node_bytes"],
        "inter_node_bytes_per_step": t["inter_node_bytes_per_step"],
        "intra_node_bytes": t["intra_node_bytes"],
        "compression_ratio": summary["compression_ratio"],
        "epoch": summary["epochs"],
        **{f"time_share/{part}": v for part, v in summary["time"]["share"].items()},
    }


def ranks_csv(factorizations: list[dict[str, Any]], layers: dict[str, Any]) -> str:
    """Every factorisation's kept rank per layer, with the layer's matrix shape (out × in·kh·kw)
    and its factors' (A: max × k, B: k × min, the authors' orientation)."""
    out = io.StringIO()
    out.write("step,layer,rank,rows,cols,full_rank,kept_fraction,a_shape,b_shape\n")
    for f in factorizations:
        for name, k in f["ranks"].items():
            shape = layers[name].w.shape
            rows, cols = lowrank.as_matrix(layers[name].w).shape
            a, b = ("x".join(map(str, s)) for s in lowrank.factor_shapes(shape, k))
            out.write(f"{f['step']},{name},{k},{rows},{cols},{min(rows, cols)},")
            out.write(f"{k / min(rows, cols):.6g},{a},{b}\n")
    return out.getvalue()


LAYERS_CSV_HEADER = "layer,kind,weight_shape,rows,cols,full_rank,factorised,reason"


def layers_csv(survey: list[lowrank.LayerChoice]) -> str:
    """`layers.csv`: every weight layer of the model, whether AB factorises it and, if
    not, why it is kept full rank (lowrank.survey's reasons); ranks.csv holds the ranks
    of the factorised ones."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(LAYERS_CSV_HEADER.split(","))
    for c in survey:
        shape = "x".join(map(str, c.shape)) if c.shape else "?"
        # a reason may hold a comma or quotes (a glob pattern): the writer quotes it
        row = [c.name, c.kind, shape, c.rows, c.cols, c.full_rank, int(c.factorised), c.reason]
        w.writerow(row)
    return out.getvalue()


def mean_rank_fraction(ranks: dict[str, int], layers: dict[str, Any]) -> float:
    """The kept rank over the full rank, averaged over the factorised layers."""
    full = {n: min(lowrank.as_matrix(layers[n].w).shape) for n in ranks}
    return sum(ranks[n] / full[n] for n in ranks) / len(ranks)


def summarize(
    cfg: Config,
    run: RunState,
    factorizations: list[dict[str, Any]],
    traffic: dict[str, Any],
    where: dict[str, Any],
    global_batch: int,
    train_samples: int,
    survey: list[lowrank.LayerChoice] | None = None,
) -> dict[str, Any]:
    """summary.json: the run's accuracy, compression, traffic (the ledger's world totals)
    and time; `where`: run_name, world_size, nodes, ranks_per_node. `survey`: the model's
    lowrank.survey under an AB method, whose kept layers go to `full_rank_layers` as
    {layer: reason}; None (a full-rank method) writes null there."""
    tops = [e["val_top1"] for e in run.evals]
    losses = [e["val_loss"] for e in run.evals]
    last = factorizations[-1] if factorizations else None
    steps = run.step if run.stopped_early else cfg.steps  # what it trained
    traffic["inter_node_bytes_per_step"] = traffic["inter_node_bytes"] / steps
    return dict(
        method=cfg.method,
        run_name=where["run_name"],
        tags=dict(cfg.tracking.tags),
        world_size=where["world_size"],
        nodes=where["nodes"],
        ranks_per_node=where["ranks_per_node"],
        batch_size=cfg.batch_size,  # per rank
        global_batch=global_batch,
        steps=steps,
        stopped_early=run.stopped_early,
        epochs=steps * global_batch / train_samples,
        val_top1=dict(best=max(tops), final=tops[-1]),
        val_loss=dict(min=min(losses), final=losses[-1]),
        train_loss_final=run.last_loss,
        compression_ratio=last["compression_ratio"] if last else 1.0,
        ranks=last["ranks"] if last else {},
        full_rank_layers=lowrank.kept_full_rank(survey) if survey is not None else None,
        factorizations=factorizations,
        traffic=traffic,
        time=run.time_summary(),
        wall_seconds=run.elapsed,
        evals=run.evals,
        machine=machine(),
    )


def machine() -> dict[str, Any]:
    """What a run's figures depend on beyond its config and data: torch and its MKL, the CPU
    kernels torch dispatches to (and whether they were forced), its threads, the CPU.

    Training is deterministic on one machine; an SVD or a QR (AB's factorisation,
    PowerSGD's) sums in another order on another CPU's kernels, so the last digits of a
    top-1 may move there while bytes and compression do not (docs/reproduce.md)."""
    import platform
    import re

    mkl = re.search(r"Math Kernel Library Version ([0-9.]+)", torch.__config__.show())
    cpu = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        cpu = platform.processor() or None
    return dict(
        torch=torch.__version__,
        mkl=mkl.group(1) if mkl else None,
        cpu_capability=torch.backends.cpu.get_cpu_capability(),
        forced={k: os.environ[k] for k in FORCING if k in os.environ},
        threads=torch.get_num_threads(),
        cpu=cpu,
    )


# the settings that force other kernels than the CPU's best (torch's, MKL's)
FORCING = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "MKL_DEBUG_CPU_TYPE")


def plain_model(
    cfg: Config, classes: int, features: int, model: torch.nn.Module, layers: dict[str, Any]
) -> torch.nn.Module:
    """The merged full-rank model as the model zoo builds it (plain Linear/Conv layers,
    no factors, no process groups), on the CPU."""
    # the factory's own init only: the run's weights replace it at once (ortho_sigma's SVD of
    # every weight took 9 s of a ViT-B/16 run's end)
    bare = cfg.model_copy(update={"model": cfg.model.model_copy(update={"init": "default"})})
    with torch.random.fork_rng(devices=[]):  # build() seeds the global generator
        plain = models.build(bare, classes, features)
    factors = {f"{n}.{p}" for n in layers for p in ("a", "b")}
    state = {k: v.cpu() for k, v in model.state_dict().items() if k not in factors}
    plain.load_state_dict(state)
    return plain.eval()


class Results:
    """Rank 0's files at the end of a run, and the same figures and files in MLflow."""

    def __init__(
        self,
        out: Path,
        cfg: Config,
        where: dict[str, Any],
        tracker: Tracker,
        task: Any,
        progress: Progress,
    ) -> None:
        self.out, self.cfg, self.where, self.tracker = out, cfg, where, tracker
        self.task, self.progress = task, progress
        self.example: torch.Tensor | None = None  # an input batch, the logged model's

    def write(
        self,
        run: RunState,
        factorizations: list[dict[str, Any]],
        ledger: Ledger,
        model: torch.nn.Module,
        layers: dict[str, Any],
        global_batch: int,
        survey: list[lowrank.LayerChoice] | None = None,
    ) -> dict[str, Any]:
        """summary.json, ranks.csv, model.pt, ledger.jsonl (rows joined one rank's file at
        a time, if kept); the final metrics, artifacts and model to MLflow. `survey`: an AB
        method's lowrank.survey of the model, written to layers.csv and summarised in
        summary.json's `full_rank_layers`."""
        names = ["summary.json", "ledger.csv", "config.json", "model.pt", "train_log.csv"]
        if self.cfg.tracking.ledger_rows:
            names.append(ledger.concat_rows(self.where["world_size"]).name)
        if factorizations:
            atomic_write_text(self.out / "ranks.csv", ranks_csv(factorizations, layers))
            names.append("ranks.csv")
        if survey is not None:
            atomic_write_text(self.out / "layers.csv", layers_csv(survey))
            names.append("layers.csv")
        traffic = ledger.totals(self.where["world_size"])
        summary = summarize(
            self.cfg, run, factorizations, traffic, self.where, global_batch, len(self.task), survey
        )
        write_record(self.out / "summary.json", summary)
        atomic_save(model.state_dict(), self.out / "model.pt")
        self.tracker.metrics(run.step, final_metrics(summary))
        self.tracker.artifacts([self.out / n for n in names])
        if self.cfg.tracking.log_model and self.tracker.run_id is not None:
            self._log_model(model, layers, run.step)
        return summary

    def _log_model(self, model: torch.nn.Module, layers: dict[str, Any], step: int) -> None:
        try:
            plain = plain_model(self.cfg, self.task.classes, self.task.features, model, layers)
            if self.example is None:  # resumed after the last evaluation
                x, _ = next(iter(self.task.val_batches(0, 1, 2)))
                self.example = x[:2].float().cpu()
            self.tracker.model(plain, self.example, step)
        except Exception as err:  # the run's results are in already: keep them
            self.progress.warn(
                f"the model was not logged to MLflow: {type(err).__name__}: {err} "
                f"(its weights are in {self.out / 'model.pt'})"
            )
