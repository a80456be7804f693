"""Validation of the one merged model: each rank scores its shard of the validation set,
and one all-reduce gives every rank the same loss, top-1 and top-5."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F

from abtrain.distributed.ledger import Ledger
from abtrain.run.runstate import RunState


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    device: torch.device,
    ledger: Ledger,
    label_smoothing: float = 0.0,
) -> tuple[dict[str, float], torch.Tensor | None]:
    """(val_loss, val_top1, val_top5 over the world; this rank's first two inputs, the
    logged model's example). In float32 whatever the training's precision, autocast off
    even where the caller has it on, as the authors validate: the number reported is the
    model's, not bfloat16's rounding of it. The loss is cross-entropy with
    `label_smoothing` (`val_loss: smoothed` passes the training's, as the authors score it)."""
    model.eval()
    example = None
    sums = torch.zeros(4, dtype=torch.float64, device=device)  # loss, top1, top5, n
    for x, y in batches:
        if example is None:
            example = x[:2].float().cpu()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with torch.autocast(device.type, enabled=False):
            logits = model(x).float()
        top5 = logits.topk(min(5, logits.shape[1]), dim=1).indices
        loss = F.cross_entropy(logits, y, reduction="sum", label_smoothing=label_smoothing)
        sums[0] += loss.double()
        sums[1] += (top5[:, 0] == y).sum()
        sums[2] += (top5 == y[:, None]).any(1).sum()
        sums[3] += len(y)
    ledger.all_reduce(sums)
    model.train()
    loss, top1, top5, n = sums.tolist()
    return dict(val_loss=loss / n, val_top1=100 * top1 / n, val_top5=100 * top5 / n), example


def record(
    run: RunState, scores: dict[str, float], global_batch: int, train_samples: int, sent: int
) -> dict[str, Any]:
    """The evaluation as the run keeps it: the scores, where in training they were made,
    and the training loss and top-1 since the last one (whose window starts anew)."""
    samples = run.step * global_batch
    result = dict(
        step=run.step,
        **scores,
        seconds=run.elapsed,  # training time so far, for time-to-accuracy
        samples=samples,  # seen, over all ranks
        epoch=samples / train_samples,
        # the summary's per-rank traffic as it stood: the last evaluation's figure and
        # the summary's differ only by the final checkpoint's collectives
        inter_node_bytes=sent,
    )
    loss_sum, top1_sum, n_steps = run.window
    if n_steps:
        result["train_loss"], result["train_top1"] = loss_sum / n_steps, top1_sum / n_steps
    run.window = [0.0, 0.0, 0.0]
    run.evals.append(result)
    return result
