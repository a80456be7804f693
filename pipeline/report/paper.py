"""The report beside the paper: the runs' traffic (the paper's Table 1) and compression (its
Table 2), each with the paper's own table and ratios beside it, and Table 1 at the paper's
scale as the planner predicts it (bench.paper_scale)."""

from __future__ import annotations

from typing import Any

from pipeline.report import tables
from pipeline.report.markdown import DASH, fmt, mean_sd, paragraphs, table
from pipeline.report.notes import compression_notes, traffic_notes


def traffic_section(
    done: dict[str, dict], t1: list[dict[str, Any]], missing: list[str], paper: dict[str, Any]
) -> list[str]:
    """The runs' traffic, the paper's Table 1 beside it, and Table 1 at the paper's scale."""
    return [
        *traffic_table(done, t1, missing),
        *paper_table1(paper),
        *like_for_like(t1, paper),
        *paper_scale_rates(paper),
    ]


def traffic_table(done: dict[str, dict], t1: list[dict[str, Any]], missing: list[str]) -> list[str]:
    md = [
        "## Traffic (the paper's Table 1)",
        "",
        "Inter-node bytes each process puts on the wire, from the runs' ledgers.",
        "",
    ]
    head = [
        "run",
        "method",
        "nodes × ranks",
        "batch",
        "global batch",
        "inter-node MB/step",
        "bytes vs ddp",
        "inter-node GB/s",
        "GB/s vs ddp",
    ]
    rows = [
        [
            r["run"],
            r["method"],
            f"{r['nodes']} × {r['ranks_per_node']}",
            r["batch"],
            r["global_batch"],
            f"{r['inter_bytes_per_step'] / 1e6:.3f}",
            fmt(r["ratio_to_ddp"], ".3f"),
            f"{r['inter_gb_per_s']:.4f}",
            fmt(r["rate_ratio_to_ddp"], ".3f"),
        ]
        for r in t1
    ]
    rows += [[name, *[DASH] * (len(head) - 1)] for name in missing]
    md += table(head, rows)
    return md + ["", *paragraphs(traffic_notes(done, t1))]


def paper_ratio(r: dict[str, Any], scheme: str) -> tuple[float, float] | None:
    """A Table 1 row's AB/baseline ratio for `scheme` ('local' or 'global') and its sd,
    propagated from the paper's two ± as independent errors."""
    a, b = r[f"{scheme}_ab"], r[f"{scheme}_baseline"]
    if not b:
        return None
    sa, sb = r[f"{scheme}_ab_sd"], r[f"{scheme}_baseline_sd"]
    ratio = a / b
    return ratio, ratio * ((sa / a) ** 2 + (sb / b) ** 2) ** 0.5


def paper_table1(paper: dict[str, Any]) -> list[str]:
    def cell(r: dict[str, Any], key: str) -> str:
        return DASH if r[key] is None else f"{r[key]:.2f} ± {r[key + '_sd']:.2f}"

    def ratio(r: dict[str, Any], scheme: str) -> str:
        x = paper_ratio(r, scheme)
        return DASH if x is None else f"{x[0]:.2f} ± {x[1]:.2f}"

    md = [
        "The paper (GB/s per process, A100 nodes on InfiniBand, mean ± its stated spread) "
        "and its AB/baseline ratio:",
        "",
    ]
    head = [
        "model",
        "N",
        "local: baseline",
        "local: AB",
        "ratio",
        "global: baseline",
        "global: AB",
        "ratio",
    ]
    rows = [
        [
            r["model"],
            r["N"],
            cell(r, "local_baseline"),
            cell(r, "local_ab"),
            ratio(r, "local"),
            cell(r, "global_baseline"),
            cell(r, "global_ab"),
            ratio(r, "global"),
        ]
        for r in paper["table1"]["rows"]
    ]
    md += table(head, rows)
    md += [
        "",
        "N: nodes of 4 GPUs (at constant local batch the paper's N is the global batch in "
        "thousands, 1,024 images per node, so the same count); — : no such run in the paper "
        "(2 nodes at constant global batch). A ratio's ± is propagated from the paper's two "
        "± as independent errors.",
    ]
    return md


def like_for_like(t1: list[dict[str, Any]], paper: dict[str, Any]) -> list[str]:
    """The `ab` runs' GB/s ratio beside the paper's, batch scheme by batch scheme, and where
    their bytes go."""
    ab_rows = [r for r in t1 if r["method"] == "ab" and r["rate_ratio_to_ddp"]]
    if not ab_rows:
        return []

    def mean(key):
        return sum(r[key] for r in ab_rows) / len(ab_rows)

    pairs = []
    for scheme, words in (("local", "constant local batch"), ("global", "constant global batch")):
        here = [r["rate_ratio_to_ddp"] for r in ab_rows if r["batch"] == scheme]
        there = [x[0] for r in paper["table1"]["rows"] if (x := paper_ratio(r, scheme))]
        if here and there:
            pairs.append(f"{words}: **{mean_sd(here)}** here, **{mean_sd(there)}** in the paper")
    tf = mean("time_factor")
    return [
        "",
        "Like for like: the paper's Table 1 is GB/s per process over wall time, so its "
        "AB/baseline ratio is set beside AB's GB/s over DDP's here, for each batch scheme "
        "(mean ± sample sd over the `ab` runs here and over the paper's rows; the paper's "
        "rows span 2-32 nodes, these 2): " + "; ".join(pairs) + ".",
        "",
        "Where AB's bytes go, each part over DDP's inter-node bytes (mean over the `ab` "
        "runs), and the factor that turns the byte ratio into the GB/s ratio "
        "(DDP's wall time over AB's):",
        "",
        *table(
            [
                "full-rank steps (warm-up, rebounds)",
                "syncs and rank agreement",
                "AB steps",
                "other (setup, evaluations, checkpoints, ledger)",
                "bytes vs ddp",
                "× time factor",
                "= GB/s vs ddp",
            ],
            [
                [
                    f"{mean('part_full_rank_steps'):.3f}",
                    f"{mean('part_syncs'):.3f}",
                    f"{mean('part_ab_steps'):.3f}",
                    f"{mean('part_other'):.3f}",
                    f"{mean('ratio_to_ddp'):.3f}",
                    f"{tf:.3f}",
                    f"{mean('rate_ratio_to_ddp'):.3f}",
                ]
            ],
        ),
        "",
        "The full-rank steps send what DDP sends in as many steps, so that part is about "
        "the share of steps at full rank (the schedule's); the syncs send A and B, more "
        "than W while the kept ranks stay above mn/(m+n); AB steps send nothing across "
        "nodes when the groups are nodes. The time factor is AB's own cost in wall time "
        "(SVDs, syncs, re-wrapping; `time` in each summary) on this machine, which a GPU "
        "cluster's would not share"
        + (
            f": below 1 ({tf:.3f}), AB's runs took longer than DDP's, so its GB/s ratio "
            "is lower than its byte ratio."
            if tf < 1
            else "."
        ),
    ]


def paper_scale_rates(paper: dict[str, Any]) -> list[str]:
    """Table 1 at the paper's scale, predicted: the planner's GB/s per process for the
    paper profile's ViT-B/16 and ResNet-50 runs (`python -m bench.paper_scale`)."""
    result = tables.paper_scale()
    if result is None:
        return []
    rates, m = result.get("rates", []), result.get("rate_model", {})
    if not rates:
        return []
    return [
        *paper_scale_intro(m, rates),
        *paper_scale_table(paper, rates),
        *paper_scale_notes(rates),
        *sync_batchnorm_note(rates),
        *buffers_paragraph(rates),
    ]


def paper_scale_intro(m: dict[str, Any], rates: list[dict[str, Any]]) -> list[str]:
    """The section's heading and the time model it states."""
    return [
        "",
        "### Table 1 at the paper's scale, predicted",
        "",
        "No run here has the paper's scale, so the planner predicts it "
        "([`bench/results/paper_scale.json`](../bench/results/paper_scale.json), "
        "`python -m bench.paper_scale`): the inter-node bytes of the paper profile's runs "
        "(the authors' schedules, 4 GPUs per node) and a stated time model, each step its "
        f"compute at {m['flops_per_s'] / 1e12:.0f} TFLOP/s (torch's FLOP count of the step; "
        f"{m['utilisation']:.0%} of an A100's bf16 peak) plus its node's bytes over one "
        f"{m['link_bytes_per_s'] / 1e9:.0f} GB/s link, without overlap. Nothing is fitted "
        "to the paper's values." + band_text(m.get("band"), rates),
        "",
    ]


def paper_scale_table(paper: dict[str, Any], rates: list[dict[str, Any]]) -> list[str]:
    """A row per predicted run, the paper's figures beside it."""
    head = [
        "model",
        "N",
        "batch",
        "s/step ddp",
        "GB/s ddp",
        "GB/s ab",
        "GB/s ab/ddp",
        "GB/s ab/ddp, band",
        "bytes ab/ddp",
        "GB/s ab/ddp, BN per group",
        "full-rank steps",
        "AB steps",
        "syncs",
        "other",
        "paper ddp",
        "paper ab",
        "paper ab/ddp",
    ]
    body = []
    for r in rates:
        band = (
            f"{r['rate_ratio_band_min']:.3f}–{r['rate_ratio_band_max']:.3f}"
            if r.get("rate_ratio_band_min") is not None
            else DASH
        )
        body.append(
            [
                r["model"],
                r["nodes"],
                r["batch"],
                f"{r['ddp_step_seconds']:.3f}",
                f"{r['ddp_gb_per_s']:.2f}",
                f"{r['ab_gb_per_s']:.2f}",
                f"{r['rate_ratio']:.3f}",
                band,
                f"{r['bytes_ratio']:.3f}",
                fmt(r.get("rate_ratio_group_bn"), ".3f"),
                f"{r['part_full_rank_steps']:.3f}",
                f"{r['part_ab_steps']:.3f}",
                f"{r['part_syncs']:.4f}",
                f"{r['part_other']:.4f}",
                fmt(r["paper_ddp_gb_per_s"]),
                fmt(r["paper_ab_gb_per_s"]),
                paper_ratio_cell(paper, r),
            ]
        )
    return table(head, body)


def paper_scale_notes(rates: list[dict[str, Any]]) -> list[str]:
    """What the columns mean, how far the prediction is from the paper, the 2-node rows."""
    gaps = [r["paper_ratio"] - r["rate_ratio"] for r in rates if r["paper_ratio"]]
    scale = [r["paper_ddp_gb_per_s"] / r["ddp_gb_per_s"] for r in rates if r["paper_ratio"]]
    return [
        "",
        "N: nodes; batch: constant local (256 per GPU) or global (4,096) batch. "
        "The bytes ratio splits into its parts (each over DDP's bytes): the full-rank steps "
        "(warm-up and rebounds, which send what DDP sends), the AB steps (nothing crosses "
        "nodes there but ResNet-50's SyncBatchNorm statistics, over the world as the "
        "authors ran it), the syncs, and the rest (setup, evaluations, checkpoints). The GB/s "
        "ratio is the bytes ratio times DDP's step time over AB's: AB's steps in its "
        "independent phases don't wait for the network, so its rate ratio is above its "
        "bytes ratio, more so where the network is a larger share of DDP's step (many "
        f"nodes, small local batches). The paper's ratio minus the prediction is "
        f"{min(gaps):+.3f} to {max(gaps):+.3f}; the schedule (full-rank share) is the "
        "authors', so what remains is how the paper measured traffic and time. The "
        "absolute GB/s are not comparable: they hang on the stated compute rate, and the "
        f"paper's DDP rates are {min(scale):.1f}-{max(scale):.1f} times these.",
        "",
        "The 2-node ResNet-50 row stands for both of the authors' 2-node configs, which "
        "differ only in weight decay (0.1 in `common.yaml`, 0.01 in `common0.01.yaml`, both "
        "runs named ab-2k at c3dbc10): the paper does not say which it reports, so the "
        "profile runs both (`r50-*-2n-local`, `r50-*-2n-local-wd0.01`), each against its "
        "own ddp run; weight decay moves no byte.",
    ]


def sync_batchnorm_note(rates: list[dict[str, Any]]) -> list[str]:
    """ResNet-50's SyncBatchNorm over the world, as the authors ran it, and what it moves."""
    moved = [
        r["rate_ratio"] - r["rate_ratio_group_bn"]
        for r in rates
        if r.get("sync_batchnorm") == "world" and r.get("rate_ratio_group_bn")
    ]
    if not moved:
        return []
    return [
        "",
        "ResNet-50's SyncBatchNorm is counted as the authors ran it (`dist.sync_batchnorm: "
        "world`): torch's SyncBatchNorm over the whole world, every step, AB phases "
        "included, all-gathering each rank's 2C+1 statistics per BatchNorm layer forward "
        "and all-reducing 2C gradients backward. Its bytes grow with the world, so they "
        "weigh most at 32 nodes. Against the same runs with the statistics over the "
        'phase\'s DDP group (column "BN per group": what an AB phase costs when its '
        "batch statistics stay inside the node), the ResNet-50 AB/DDP rate ratio moves "
        f"by {min(moved):+.3f} to {max(moved):+.3f}; ViT-B/16 has no BatchNorm.",
    ]


def buffers_paragraph(rates: list[dict[str, Any]]) -> list[str]:
    """What DDP's broadcast_buffers, on in the authors' runs and off in abtrain's, would
    add to the predicted rows (bench.paper_scale's `buffer_*` columns)."""
    rows = [r for r in rates if r.get("buffer_bytes")]
    if not rows:
        return []
    sizes = sorted({r["buffer_bytes"] for r in rows})
    shares = [r["ddp_buffer_share"] for r in rows]
    ab = [r["ab_buffer_bytes_per_step"] / r["ddp_buffer_bytes_per_step"] for r in rows]
    models = sorted({r["model"] for r in rows})
    return [
        "",
        "Not counted above, and not sent by abtrain: the authors' DDP kept torch's default "
        "`broadcast_buffers=True`, so before every forward pass the first rank of the "
        f"step's DDP group sent every buffer of {' and '.join(models)} "
        f"({', '.join(f'{b:,}' for b in sizes)} bytes: BatchNorm's running statistics and "
        "counters) to the rest of the group. abtrain turns it off (its replicas agree "
        "without it; the sync averages the running statistics). Counted, it would add "
        f"{min(shares):.2%}-{max(shares):.2%} to DDP's inter-node bytes per step in these "
        f"rows, and to AB's {min(ab):.2f}-{max(ab):.2f} times as many bytes as to DDP's "
        "(none in AB steps whose groups are nodes); the bytes ratio moves by less than "
        "that share.",
    ]


def paper_ratio_cell(paper: dict[str, Any], r: dict[str, Any]) -> str:
    """The paper's AB/DDP GB/s ratio of a predicted row, with its propagated ±."""
    for row in paper["table1"]["rows"]:
        if row["model"] == r["model"] and row["N"] == r["nodes"]:
            x = paper_ratio(row, r["batch"])
            if x:
                return f"{x[0]:.3f} ± {x[1]:.3f}"
    return DASH


def band_text(band: dict[str, Any] | None, rates: list[dict[str, Any]]) -> str:
    """The time model's band (compute rates × ports per node) and how many of the paper's
    ratios fall inside it: the GB/s ratio moves with both, not only the absolute GB/s."""
    if not band:
        return ""
    judged = [r for r in rates if r.get("paper_ratio_in_band") is not None]
    inside = sum(r["paper_ratio_in_band"] for r in judged)
    c = band["central"]
    return (
        " The paper's nodes have two network adapters and it does not state its compute "
        "rate, and the GB/s ratio moves with both (AB's steps wait less for the network than "
        "DDP's), so the band column gives the ratio's lowest and highest over compute at "
        f"{', '.join(f'{u:.0%}' for u in band['utilisations'])} of the peak × "
        f"{' or '.join(str(n) for n in band['ports'])} ports of "
        f"{band['port_bytes_per_s'] / 1e9:.0f} GB/s per node (the single figure is "
        f"{c['utilisation']:.0%} and {c['ports']} port). The paper's ratio lies inside its "
        f"row's band in {inside} of {len(judged)} rows."
    )


def compression_section(t2: list[dict[str, Any]], paper: dict[str, Any]) -> list[str]:
    """The AB runs' compression and reductions, and the paper's Table 2 beside them."""
    return [*compression_table(t2), *paper_table2(paper)]


def compression_table(t2: list[dict[str, Any]]) -> list[str]:
    md = [
        "",
        "## Accuracy, compression, communication reduction (the paper's Table 2)",
        "",
        "Compression: parameters of the full model over those of the trained one (A and B in "
        "place of each factorised W). ECR = 100% − F − L·c (Eq. 4, F = 25%, L = 75%, c = "
        "final size in % of full); ECR* counts the share of steps in AB phases, which send "
        "nothing across groups (our reading of the paper's asterisk); measured = 1 − "
        "inter-node bytes / ddp's. Δ top-1 of runs trained at several seeds "
        "(`experiments.seeds`): the mean ± sd of the seed-by-seed differences, as the paper "
        "averages 3 seeds.",
        "",
        *table(
            ["run", "method", "Δ top-1 vs ddp", "compression", "ECR", "ECR*", "measured reduction"],
            [
                [
                    r["run"],
                    r["method"],
                    top1_cell(r),
                    f"{r['compression']:.2f}:1",
                    f"{r['ecr']:.1f}%",
                    fmt(r["ecr_groups"], ".1f", "%"),
                    fmt(r["measured_reduction"], ".1f", "%"),
                ]
                for r in t2
            ],
        ),
    ]
    return md + ["", *paragraphs(compression_notes(t2))]


def top1_cell(r: dict[str, Any]) -> str:
    """Δ top-1, with ± the sd over seeds where the runs were trained at several."""
    if r.get("diff_top1_sd") is None:
        return fmt(r["diff_top1"], "+.2f")
    return f"{r['diff_top1']:+.2f} ± {r['diff_top1_sd']:.2f}"


def paper_table2(paper: dict[str, Any]) -> list[str]:
    rows = []
    for r in paper["table2"]["rows"]:
        ecr = f"{r['ecr']:.2f}%"
        cells = (DASH, ecr) if r["ecr_asterisk"] else (ecr, DASH)
        rows.append(
            [
                r["setting"],
                r["method"],
                f"{r['diff_top1']:+.2f}",
                f"{r['compression']}:1",
                cells[0],
                cells[1],
            ]
        )
    md = [
        "The paper:",
        "",
        *table(["setting", "method", "Δ top-1", "compression", "ECR", "ECR*"], rows),
    ]
    md += [
        "",
        "The paper marks AB's ECR with an asterisk (its independent groups are assumed not to "
        "use the interconnect), so those two values stand in the ECR* column, beside the "
        "runs' ECR* above; the paper gives no unstarred ECR for AB.",
        "",
        f"Measured reduction claimed by the paper: {paper['table2']['measured_reduction_claim']}.",
    ]
    if tables.table2_study():
        md += [
            "",
            "The paper's 44:1 comes from VGG16 in timm's layout trained 15,000 steps; "
            "[`table2/`](table2/README.md) runs that model at CPU scale against DDP "
            "(`bash scripts/table2.sh`), where the compression does rise above 1:1.",
        ]
    return md
