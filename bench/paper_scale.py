"""The paper's scale on paper: predicted inter-node bytes per rank per step for the paper
profile's ViT-B/16 and ResNet-50 runs at 2-32 nodes, beside the paper's Table 1; and for
every run of the matrix what it keeps: memory per GPU, checkpoint bytes and disk, ledger
and log records (`abtrain.predict.footprint.footprint`).

    python -m bench.paper_scale [--out FILE]   # writes bench/results/paper_scale.json, prints tables

A computation, no training (the DVC stage `paper_scale` runs it). The ranks training keeps are
an assumption (`keep`, a fraction of each layer's full rank); both full rank (1.0) and
half (0.5) are shown. The paper-scale GB/s rest on a stated compute rate and link; each
Table 1 row also carries AB's rate over DDP's across a band of both (`rate_ratio_band`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import yaml

from abtrain import config as abconfig
from abtrain.files import read_record, write_record
from abtrain.method.methods import kind
from abtrain.models import label as model_label
from abtrain.predict.footprint import footprint
from abtrain.predict.timing import predict, step_flops, timing
from abtrain.predict.traffic import Estimate, buffer_broadcast, estimate
from pipeline.matrix import base_config, run_overrides, runs
from pipeline.stage import stage

IMAGENET_TRAIN = 1_281_167
PAPER = Path("profiles/paper.yaml")
# (training images, classes) of the data sets the matrix uses, which needn't be here
DATASETS = {"imagenet": (IMAGENET_TRAIN, 1000), "cifar10": (50_000, 10), "cifar100": (50_000, 100)}
# The stated model of the paper's hardware (Section 4.1: four A100-40 GPUs and two network
# adapters per node, InfiniBand 4X HDR at 200 Gbit/s = 25 GB/s per port). The central
# assumption: a step computes at a fixed share of the A100's dense bf16 peak, the same for
# every run and method, and a node's traffic uses one port. Neither is fitted to the
# paper's figures. The AB/DDP rate ratio depends on both (the network's share of DDP's
# step), so every Table 1 row also gets the ratio over a band: each utilisation x 1 or 2
# ports (both adapters carrying traffic at full rate).
A100_BF16_FLOPS = 312e12
UTILISATION = 0.4
LINK_BYTES_PER_S = 25e9
BAND_UTILISATION = (0.2, 0.4, 0.6)
BAND_PORTS = (1, 2)
GROUP_BN = ["dist.sync_batchnorm=group"]
RESULTS = Path("bench/results")


def rate_bytes_per_s(rate: str) -> float | None:
    """A tc rate as bench.network names it ('200mbit', '1gbit', 'unshaped') in bytes/s;
    None for anything else (unshaped, or a file name that is not a rate: '4n-200mbit')."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(k|m|g)bit", rate)
    return float(m.group(1)) * {"k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] / 8 if m else None


def parts(ab: Estimate, ddp: Estimate) -> dict[str, float]:
    total = ddp.inter_bytes
    full = sum(ab.steps[k] * ab.step_bytes[k] for k in ("warmup", "rebound"))
    other = sum(v for k, v in ab.event_bytes.items() if k != "sync")
    return dict(
        part_full_rank_steps=full / total,
        part_syncs=ab.event_bytes["sync"] / total,
        part_ab_steps=ab.steps["ab"] * ab.step_bytes["ab"] / total,
        part_other=other / total,
    )


def paper_rates(
    p: dict, ref: list[dict], models: tuple[str, ...] = ("vit-", "r50-"), max_nodes: int = 0
) -> list[dict]:
    """Predicted inter-node GB/s per process of the paper profile's ViT-B/16 and ResNet-50
    runs on the stated hardware model, AB's over DDP's beside the paper's Table 1; only
    the runs of `models` (name prefixes) on at most `max_nodes` nodes (0: any)."""
    out = []
    matrix = runs(p)
    seen = set()
    for name, run in matrix.items():
        if not name.startswith(models) or run.method != "ab":
            continue
        if max_nodes and run.nodes > max_nodes:
            continue
        # one row per Table 1 cell: the 2-node ResNet-50 runs at either weight decay of
        # the authors' two configs send the same bytes (the first, 0.1, stands for both)
        if (name.split("-")[0], run.nodes, run.batch) in seen:
            continue
        seen.add((name.split("-")[0], run.nodes, run.batch))
        base = name.replace("-ab-", "-ddp-")
        rates = {}
        # the profile's runs (SyncBatchNorm as the authors ran it: over the world), and the
        # same with it over the phase's DDP group (the planner's assumption before), to
        # show what the authors' SyncBatchNorm moves
        for key, bn in (
            (name, []),
            (base, []),
            ((name, "group"), GROUP_BN),
            ((base, "group"), GROUP_BN),
        ):
            r = matrix[key if isinstance(key, str) else key[0]]
            sets = run_overrides(p, r, None, size=IMAGENET_TRAIN) + bn
            cfg = abconfig.from_dict(p["train"], sets)
            flops = step_flops(cfg, 1000)
            seconds = flops / (A100_BF16_FLOPS * UTILISATION)
            t = timing(
                estimate(cfg, r.nodes, r.ranks_per_node, 1000),
                r.ranks_per_node,
                {"full": seconds},
                LINK_BYTES_PER_S,
            )
            rates[key] = dict(
                cfg=cfg,
                flops=flops,
                gb_per_s=t.gb_per_s,
                step_seconds=t.mean_step_seconds,
                compute_seconds=seconds,
                bytes_per_step=t.traffic.per_step,
                traffic=t.traffic,
            )
        before = rates[name, "group"], rates[base, "group"]
        cfg = rates[name]["cfg"]  # the profile's own run, not the group-BN variant
        # DDP's broadcast_buffers, on in the authors' runs, off in abtrain's: what it sends
        buffers = {
            key: buffer_broadcast(rates[key]["cfg"], r.nodes, r.ranks_per_node, 1000)
            for key, r in ((name, run), (base, matrix[base]))
        }
        label = {"vit": "ViT-B/16", "r50": "ResNet-50"}[name.split("-")[0]]
        paper = next((x for x in ref if x["model"] == label and x["N"] == run.nodes), None)
        pb = paper and paper[f"{run.batch}_baseline"]
        pr = paper[f"{run.batch}_ab"] / pb if pb else None
        band = ratio_band(rates[name], rates[base], run.ranks_per_node)
        lo, hi = min(b["rate_ratio"] for b in band), max(b["rate_ratio"] for b in band)
        out.append(
            dict(
                run=name,
                model=label,
                nodes=run.nodes,
                batch=run.batch,
                ddp_gb_per_s=rates[base]["gb_per_s"],
                ab_gb_per_s=rates[name]["gb_per_s"],
                ddp_step_seconds=rates[base]["step_seconds"],
                ab_step_seconds=rates[name]["step_seconds"],
                compute_seconds=rates[name]["compute_seconds"],
                bytes_ratio=rates[name]["bytes_per_step"] / rates[base]["bytes_per_step"],
                rate_ratio=rates[name]["gb_per_s"] / rates[base]["gb_per_s"],
                sync_batchnorm=cfg.dist.sync_batchnorm
                if model_label(cfg.model) == "resnet50"
                else None,
                # one broadcast of every buffer; per rank per step, over each run's bytes
                buffer_bytes=buffers[name]["bytes"],
                ddp_buffer_bytes_per_step=buffers[base]["inter_bytes_per_step"],
                ab_buffer_bytes_per_step=buffers[name]["inter_bytes_per_step"],
                ddp_buffer_share=buffers[base]["inter_bytes_per_step"]
                / rates[base]["bytes_per_step"],
                bytes_ratio_group_bn=before[0]["bytes_per_step"] / before[1]["bytes_per_step"],
                rate_ratio_group_bn=before[0]["gb_per_s"] / before[1]["gb_per_s"],
                # AB's bytes over DDP's, by where AB sends them (each over DDP's total)
                **parts(rates[name]["traffic"], rates[base]["traffic"]),
                paper_ddp_gb_per_s=pb or None,
                paper_ab_gb_per_s=paper[f"{run.batch}_ab"] if pb else None,
                paper_ratio=pr,
                # AB/DDP GB/s over the band of compute rates and ports (ratio_band)
                rate_ratio_band=band,
                rate_ratio_band_min=lo,
                rate_ratio_band_max=hi,
                paper_ratio_in_band=lo <= pr <= hi if pr else None,
            )
        )
    return out


def ratio_band(ab: dict, ddp: dict, ranks_per_node: int) -> list[dict]:
    """AB's GB/s over DDP's for one Table 1 row at each compute utilisation x port count of
    the band (`paper_rates`' plans, their compute scaled from the step's FLOPs)."""
    out = []
    for u in BAND_UTILISATION:
        for ports in BAND_PORTS:
            link = ports * LINK_BYTES_PER_S
            gb = [
                timing(
                    r["traffic"], ranks_per_node, {"full": r["flops"] / (A100_BF16_FLOPS * u)}, link
                ).gb_per_s
                for r in (ab, ddp)
            ]
            out.append(
                dict(
                    utilisation=u,
                    ports=ports,
                    link_bytes_per_s=link,
                    ab_gb_per_s=gb[0],
                    ddp_gb_per_s=gb[1],
                    rate_ratio=gb[0] / gb[1],
                    central=u == UTILISATION and ports == 1,
                )
            )
    return out


def measured_mean(pl: Estimate, step_seconds: dict[str, float]) -> float:
    """Mean seconds per step of a run from its per-phase means (each phase's measured step
    seconds hold the syncs that fall in its steps)."""
    if set(step_seconds) == {"full"}:  # one phase: every step (PowerSGD's first ones too)
        return step_seconds["full"]
    counts = dict(pl.steps)
    # ab_powersgd's uncompressed first full-rank steps are warm-up steps in the run's log
    # (while the warm-up is at least powersgd.start_iter long, as in every run here)
    counts["warmup"] = counts.get("warmup", 0) + counts.pop("uncompressed", 0)
    return sum(counts.get(k, 0) * v for k, v in step_seconds.items()) / pl.total_steps


def network_check(params: dict) -> list[dict]:
    """The time model against the emulated cluster (bench.network's results): each
    method's per-phase compute from its unshaped run, plus its bytes over the shaped link,
    predicts the mean seconds per training step (syncs included) at each shaped rate."""
    files = {f.stem.removeprefix("network-"): f for f in RESULTS.glob("network-*.json")}
    if "unshaped" not in files:
        return []
    free = {r["method"]: r for r in read_record(files["unshaped"], ("results",))["results"]}
    out = []
    for rate, path in sorted(files.items()):
        link = rate_bytes_per_s(rate)
        if link is None:
            continue
        bench = read_record(path)
        for r in bench["results"]:
            if r["method"] not in free:
                continue
            free_seconds = free[r["method"]]["step_seconds"]
            own = bench.get("method_overrides", {}).get(r["method"], [])  # its --method-set
            sets = [f"method={r['method']}", *bench["overrides"], *own]
            cfg = abconfig.from_dict(params["train"], sets)
            # the time model `abtrain plan` and bench.rates use; the unshaped steps hold the
            # syncs' local work already (no 'sync' entry): the link adds their bytes' time
            t = predict(cfg, bench["nodes"], bench["ranks_per_node"], 10, free_seconds, link)
            measured = measured_mean(t.traffic, r["step_seconds"])
            out.append(
                dict(
                    method=r["method"],
                    rate=rate,
                    nodes=bench["nodes"],
                    measured_step_seconds=measured,
                    predicted_step_seconds=t.mean_step_seconds,
                    error=t.mean_step_seconds / measured - 1,
                )
            )
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m bench.paper_scale",
        description="Predict, without training, the paper-scale traffic and rates of the paper "
        "profile's runs (Table 1), the time model against bench.network's committed runs, and "
        "what every run of the matrix keeps; writes one JSON file and prints tables.",
    )
    ap.add_argument("--out", default=str(RESULTS / "paper_scale.json"), help="%(default)s")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    p = yaml.safe_load(PAPER.read_text())
    ref = json.loads(Path("pipeline/paper_reference.json").read_text())["table1"]["rows"]
    rows = []
    for name, run in runs(p).items():
        if not name.startswith(("vit-", "r50-")) or run.method == "ab_nogroups":
            continue
        cfg = abconfig.from_dict(p["train"], run_overrides(p, run, None, size=IMAGENET_TRAIN))
        for keep in (1.0, 0.5):
            pl = estimate(cfg, run.nodes, run.ranks_per_node, classes=1000, keep=keep)
            rows.append(
                dict(
                    run=name,
                    model=name.split("-")[0],
                    method=run.method,
                    nodes=run.nodes,
                    batch=run.batch,
                    keep=keep,
                    inter_bytes_per_step=pl.per_step,
                )
            )
    kept = []
    for name, run in runs(p).items():
        size, classes = DATASETS[base_config(p, run).data.name]
        cfg = abconfig.from_dict(p["train"], run_overrides(p, run, None, size=size))
        for keep in (1.0, 0.5) if kind(run.method).low_rank else (1.0,):
            f = footprint(cfg, run.nodes, run.ranks_per_node, classes, keep)
            kept.append(
                dict(
                    run=name,
                    method=run.method,
                    nodes=run.nodes,
                    world=run.world,
                    batch=run.batch,
                    steps=cfg.steps,
                    keep=keep,
                    **vars(f),
                )
            )
    out = []
    for r in rows:
        if r["method"] != "ab":
            continue
        ddp = next(
            x
            for x in rows
            if x["method"] == "ddp"
            and x["model"] == r["model"]
            and x["nodes"] == r["nodes"]
            and x["batch"] == r["batch"]
            and x["keep"] == 1.0
        )
        label = {"vit": "ViT-B/16", "r50": "ResNet-50"}[r["model"]]
        paper = next((x for x in ref if x["model"] == label and x["N"] == r["nodes"]), None)
        pr = None
        if paper and paper[f"{r['batch']}_baseline"]:
            pr = paper[f"{r['batch']}_ab"] / paper[f"{r['batch']}_baseline"]
        out.append(
            dict(
                **r,
                ddp_bytes_per_step=ddp["inter_bytes_per_step"],
                predicted_ratio=r["inter_bytes_per_step"] / ddp["inter_bytes_per_step"],
                paper_ratio=pr,
            )
        )
    rates = paper_rates(p, ref)
    check = network_check(yaml.safe_load(Path("params.yaml").read_text()))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    result = dict(
        traffic=out,
        rates=rates,
        rate_model=dict(
            flops_per_s=A100_BF16_FLOPS * UTILISATION,
            utilisation=UTILISATION,
            link_bytes_per_s=LINK_BYTES_PER_S,
            band=dict(
                utilisations=list(BAND_UTILISATION),
                ports=list(BAND_PORTS),
                port_bytes_per_s=LINK_BYTES_PER_S,
                central=dict(utilisation=UTILISATION, ports=1),
                why="the paper's nodes have two network adapters (200 Gbit/s per port); "
                "the compute rate of its runs is not stated",
            ),
        ),
        network_check=check,
        footprint=kept,
    )
    write_record(a.out, result, end="\n")
    print(
        f"{'model':<6}{'nodes':>6}{'batch':>7}{'keep':>6}{'ddp MB/step':>13}"
        f"{'ab MB/step':>12}{'ab/ddp':>8}{'paper':>7}"
    )
    for r in out:
        paper = f"{r['paper_ratio']:.2f}" if r["paper_ratio"] else "—"
        print(
            f"{r['model']:<6}{r['nodes']:>6}{r['batch']:>7}{r['keep']:>6}"
            f"{r['ddp_bytes_per_step'] / 1e6:>13.1f}{r['inter_bytes_per_step'] / 1e6:>12.1f}"
            f"{r['predicted_ratio']:>8.3f}{paper:>7}"
        )
    print_rates(rates, check)
    print_footprint(kept)
    return 0


def print_rates(rates: list[dict], check: list[dict]) -> None:
    print(
        f"\nGB/s per process over wall time (A100 at {UTILISATION:.0%} of bf16 peak, "
        f"{LINK_BYTES_PER_S / 1e9:.0f} GB/s per node; no overlap of compute and network); "
        f"band: ab/ddp at {'/'.join(f'{u:.0%}' for u in BAND_UTILISATION)} of peak x "
        f"{' or '.join(map(str, BAND_PORTS))} ports"
    )
    print(
        f"{'model':<10}{'nodes':>6}{'batch':>7}{'step s':>8}{'ddp':>7}{'ab':>7}{'ab/ddp':>8}"
        f"{'band':>13}{'bytes':>7}{'paper ddp':>10}{'paper ab':>9}{'paper':>7}"
    )
    for r in rates:
        paper = [
            f"{r[k]:.2f}" if r[k] else "—"
            for k in ("paper_ddp_gb_per_s", "paper_ab_gb_per_s", "paper_ratio")
        ]
        print(
            f"{r['model']:<10}{r['nodes']:>6}{r['batch']:>7}{r['ddp_step_seconds']:>8.3f}"
            f"{r['ddp_gb_per_s']:>7.2f}{r['ab_gb_per_s']:>7.2f}{r['rate_ratio']:>8.3f}"
            f"{r['rate_ratio_band_min']:>7.3f}-{r['rate_ratio_band_max']:.3f}"
            f"{r['bytes_ratio']:>7.3f}{paper[0]:>10}{paper[1]:>9}{paper[2]:>7}"
        )
    if check:
        print("\nthe time model against the emulated cluster (mean s/step, syncs included)")
        for c in check:
            print(
                f"{c['method']:<12}{c['rate']:>9}{c['measured_step_seconds']:>8.3f}"
                f"{c['predicted_step_seconds']:>8.3f}{c['error']:>+8.1%}"
            )


def print_footprint(rows: list[dict]) -> None:
    gb = 1e9
    print(
        f"\n{'run':<22}{'keep':>5}{'steps':>7}{'GPU GB':>8}{'ckpt GB':>9}{'disk GB':>9}"
        f"{'csv rows':>10}{'csv MB':>8}{'log MB':>8}{'ledger MB':>10}"
        f"{'coll. rows':>12}{'coll. GB':>10}"
    )
    for r in rows:
        c, led = r["checkpoint"], r["ledger"]
        peak = max(m["total"] for m in r["memory"].values())
        print(
            f"{r['run']:<22}{r['keep']:>5}{r['steps']:>7}{peak / gb:>8.2f}{c['bytes'] / gb:>9.2f}"
            f"{c['disk_bytes'] / gb:>9.2f}"
            f"{led['rows']:>10}{led['csv_bytes'] / 1e6:>8.2f}{led['train_log_bytes'] / 1e6:>8.2f}"
            f"{led['memory_bytes_per_rank'] / 1e6:>10.2f}"
            f"{led['per_collective_rows']:>12}{led['per_collective_bytes'] / gb:>10.2f}"
        )
    print(
        "GPU GB: model + optimizer per GPU at its peak phase (no activations); ckpt/disk: one "
        "checkpoint at its largest phase / keep_checkpoints of them (one replica per distinct "
        "state: one before the first factorisation, one per A/B group after); ledger MB: "
        "a rank's ledger in memory (the steps since a checkpoint); coll.: "
        "per-collective ledger rows, if switched on (tracking.ledger_rows)"
    )


if __name__ == "__main__":
    sys.exit(stage(main, who="bench"))
