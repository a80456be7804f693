"""The notes under the report's tables: what a table's odd values mean, said where they
occur."""

from __future__ import annotations

from typing import Any


def accuracy_notes(rows: list[dict[str, Any]], noise: float | None) -> list[str]:
    out = [
        "Best: the highest of the run's evaluations; final: its last (the end of the run). "
        "Δ: the run minus the ddp run of the same scale and batch scheme, in percentage "
        "points (negative: below ddp); ddp rows have no Δ, they are the reference. Over "
        "seeds: the same Δ as mean ± sample sd over the seeds of a seed study made with the "
        "runs' own values (`reports/seeds-best-*`, `python -m bench.seeds --search-best`), "
        "where one pairs the run with ddp."
    ]
    if any(r["diff_best"] is not None and r["diff_best"] < 0 for r in rows):
        out.append(
            "Every run here is one seed. "
            + (
                f"Across seeds (`reports/seeds/`, `python -m bench.seeds`) one method's best "
                f"top-1 moves by up to {noise:.2f} points: a Δ smaller than that is within "
                "seed noise; its sign is what the seed study supports, not its size."
                if noise is not None
                else "Run `python -m bench.seeds` for the seed-to-seed spread before "
                "reading much into small differences."
            )
        )
    if any(r["best_top1"] != r["final_top1"] for r in rows):
        out.append(
            "Where best and final differ the run peaked before its end (evaluations are few, "
            "so one evaluation's noise decides it)."
        )
    return out


def traffic_notes(done: dict[str, dict], rows: list[dict[str, Any]]) -> list[str]:
    out = [
        "MB/step: the run's inter-node bytes over its steps, per rank (mean over ranks). "
        "bytes vs ddp: the run's inter-node bytes over those of the ddp run of the same "
        "scale and batch scheme (1.000 for ddp itself; the runs of one scale have the same "
        "steps, so this is also the ratio per step). GB/s vs ddp: the same over wall time, "
        "the paper's quantity."
    ]
    ddp = {(r["nodes"], r["ranks_per_node"]): r for r in rows if r["method"] == "ddp"}
    if any(rpn > 1 for _, rpn in ddp) and any(rpn == 1 for _, rpn in ddp):
        out.append(
            "ddp's MB/step falls as ranks are added on the same two nodes: gradients are "
            "all-reduced on a ring (2(n−1)/n of the gradient size per rank), and with 2 ranks "
            "per node only the hops from one node to the next cross the network, so the mean "
            "rank sends less across nodes (0.75× on 2 × 2 against 2 × 1)."
        )
    if len({r["batch"] for r in rows}) > 1:
        out.append(
            "The bytes of a step do not depend on the batch (same model, same gradients): "
            "the local and global runs of one scale send the same MB/step; their GB/s differ "
            "because a step of a larger batch takes longer."
        )
    return out


def compression_notes(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    low = [r for r in rows if r["compression"] < 1]
    if low:
        cs = sorted({round(r["compression"], 2) for r in low})
        kept = [r["ranks_kept"] for r in low if r["ranks_kept"] is not None]
        out.append(
            f"**Compression below 1:1** ({', '.join(f'{c:.2f}:1' for c in cs)}): the trained "
            "model is *larger* than the full one. A layer's factors A (m×r) and B (r×n) "
            "hold r(m+n) numbers where W holds mn, so factorising saves space only once the "
            "rank r falls below mn/(m+n) (half the width of a square layer). "
            + (
                "In these runs "
                + ("every one" if min(kept) == 1 else f"at least {100 * min(kept):.0f}%")
                + " of the factorised layers ended at the rank of their first factorisation "
                "(`factorizations` in "
                "results/NAME.json): at the searched weight decay, decay alone leaves "
                "nearly every singular value where the ortho-σ init put it (at 1), far above "
                "`ab.sigma_cutoff`·σ_max (the length study gives the figure, and shows that no "
                "length it reached changes it), so A and B stay larger than W; "
                "`reports/tradeoff/` searches the weight decays and cutoffs that do cut ranks. "
                if kept
                else ""
            )
            + "The traffic falls anyway (last column): in AB phases the groups train inside "
            "their node and send nothing across nodes. For a compression above 1:1 see "
            "`reports/table2/` below."
        )
    neg = [r for r in rows if r["ecr"] < 0]
    if neg:
        r = neg[0]
        c = 100 / r["compression"]
        out.append(
            f"**Negative ECR** ({r['ecr']:.1f}% for {r['compression']:.2f}:1): Eq. 4 "
            "charges the 75% of training the paper spends in low rank at the final size c, "
            f"as a percentage of the full model; below 1:1, c exceeds 100% ({c:.0f}% here), "
            "so the formula says these runs would send more than DDP (a negative reduction: "
            f"{-r['ecr']:.1f}% *more*). It prices sending the factors' gradients every "
            "step of the low-rank 75%; AB sends nothing across nodes in its AB phases, so "
            "the measured reduction, from the bytes actually sent, is the number to read."
        )
    if any(r["ecr_groups"] is None for r in rows):
        out.append(
            "ECR* is — for ab_nogroups: its one group spans every node, so its AB phases "
            "do send across nodes (B's gradient, r×n, by DDP over all ranks, in place of "
            "W's, m×n: smaller whenever r < m, hence a smaller measured reduction than ab's), "
            "and for any run whose config.json (runs/train/NAME) is not at hand."
        )
    return out
