"""Table 2 at CPU scale: the runs of scripts/table2.sh, trained, and their JSON, figure and
tables.

    python -m bench.table2 --dry-run                # the five runs and their time
    python -m bench.table2                          # train what is missing, then report
    python -m bench.table2 --runs runs/table2 --report-only   # from the run folders
    python -m bench.table2 --render                 # tables.md and the figure from table2.json

A study on bench.study's skeleton (plan, estimate, resume, ETA, record, figure, page): VGG16
in timm's layout, AB and DDP, and the mini-ViT, AB, each on 2 nodes x 1 rank with
profiles/table2.yaml, as scripts/table2.sh launches them. Reads each run folder's
summary.json and config.json and writes `table2.json` (top-1, Δ top-1 against the DDP run
of the same model, compression full:current over the whole model at every factorisation,
and per layer: shape, rank, W and A+B counts, from the last factorisation), `table2.png`
(compression vs step for each AB run, validation top-1 vs step for every run) and
`tables.md` (the tables reports/table2/README.md quotes).

The per-layer counts are recomputed from the model's layer shapes and the ranks in the
summary, and the whole-model ratio from them is checked against the summary's own.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from abtrain.files import read_record
from abtrain.models import label
from bench import study
from bench.study import Run
from pipeline.report import markdown as md
from pipeline.stage import parser, stage

RUNS = ("vgg16-ddp", "vgg16-ab", "vit-ab")  # the baseline of a model is its ddp run
# a supplementary run: VGG16 AB with the weight decay raised so that AdamW's cumulative
# decay over this run, exp(-wd * sum lr), equals the paper's 15,000 steps (about 0.1)
EXTRA = ("vgg16-ddp-wd", "vgg16-ab-wd")
CLASSES = 10
# the paper's Table 2 (ab-training.txt), VGG16 on CIFAR-10, AB training against DDP
PAPER = {
    "model": "VGG16 (timm layout, width 64), CIFAR-10, 50,000 images, 150 epochs x 100 it",
    "global_batch": 1024,
    "steps": 15000,
    "delta_top1": -0.23,
    "compression_ratio": 44.14,
    "max_top1": 91.87,
    "source": "../shared/paper/ab-training.txt, Table 2 and its caption",
    # the authors' VGG16 config (authors-code.md section 5): peak lr 3e-3, wd 0.1, 15,000
    # steps, 10 of 150 epochs of linear warm-up then cosine to ~0 (LR rebounds left out)
    "lr": 3e-3,
    "weight_decay": 0.1,
}
PAPER["lr_sum"] = PAPER["lr"] * (1000 / 2 + 14000 / 2)
PAPER["decay_factor"] = math.exp(-PAPER["weight_decay"] * PAPER["lr_sum"])

CONFIG = "profiles/table2.yaml"
SHAPE = (2, 1)  # nodes x ranks per node
RUNS_DIR = Path("runs/table2")
OUT = Path("reports/table2")
# the default mini-ViT of params.yaml: timm's VisionTransformer, width 192
VIT = (
    "model={name: python, factory: timm.models.vision_transformer:VisionTransformer, kwargs: "
    "{img_size: 32, patch_size: 8, embed_dim: 192, depth: 6, num_heads: 6, mlp_ratio: 4.0, "
    "qkv_bias: false, drop_path_rate: 0.0}, init: ortho_sigma}"
)
# each run's overrides of the profile, in the order scripts/table2.sh trains them; the
# supplementary pair packs AdamW's cumulative decay of the paper's 15,000 steps into 1,500
SETS = {
    "vgg16-ab": ["method=ab"],
    "vgg16-ddp": ["method=ddp"],
    "vit-ab": ["method=ab", VIT],
    "vgg16-ab-wd": ["method=ab", "optim.weight_decay=3.6"],
    "vgg16-ddp-wd": ["method=ddp", "optim.weight_decay=3.6"],
}


def list_runs(runs_dir: Path, committed: dict[str, Any]) -> list[Run]:
    """The five runs; each one's estimate: its committed run's time (table2.json), if any."""
    out = []
    for name, sets in SETS.items():
        took = committed.get(name, {}).get("wall_seconds")
        seconds = study.LAUNCH_SECONDS + took if took is not None else None
        out.append(Run(name, runs_dir / name, sets, *SHAPE, config=CONFIG, seconds=seconds))
    return out


def layer_shapes(cfg: dict[str, Any]) -> tuple[dict[str, list[int]], int]:
    """(module name -> weight shape of every factorisable layer, total parameter count)."""
    from abtrain import config as abconfig
    from abtrain.method import lowrank
    from abtrain.models import build

    c = abconfig.from_dict(cfg)
    model = build(c, CLASSES)
    layers = lowrank.convert(model, c.ab.full_rank_layers)
    total = sum(p.numel() for p in model.parameters() if p.numel())
    return {n: list(m.weight.shape) for n, m in layers.items()}, total


def per_layer(shapes: dict[str, list[int]], ranks: dict[str, int]) -> list[dict[str, Any]]:
    rows = []
    for name, shape in shapes.items():
        out, inner = shape[0], math.prod(shape[1:])
        w = out * inner
        k = ranks.get(name)
        ab = k * (out + inner) if k else w
        rows.append(
            dict(
                layer=name,
                shape=shape,
                matrix=[out, inner],
                full_rank=min(out, inner),
                rank=k,
                w_params=w,
                ab_params=ab,
                ratio=w / ab,
            )
        )
    return rows


def spectra(model_pt: Path, layers: list[dict[str, Any]], cutoff: float) -> None:
    """Add each layer's singular values of its final W (model.pt), relative to the largest:
    the rank the cutoff would keep now (training's own rule, `lowrank.keep_rank`, on the
    float32 values training's SVD gives), the median and the smallest."""
    if not model_pt.exists():
        return
    import torch

    from abtrain.method import lowrank

    state = torch.load(model_pt, map_location="cpu", weights_only=True)
    for row in layers:
        s = torch.linalg.svdvals(lowrank.upright(state[f"{row['layer']}.weight"]).float())
        rel = s / s[0]
        k = lowrank.keep_rank(s, cutoff)
        out, inner = row["matrix"]
        row.update(
            rank_at_end=k,
            ab_params_at_end=k * (out + inner),
            sigma_max_at_end=float(s[0]),
            sigma_median_rel_at_end=float(rel.median()),
            sigma_min_rel_at_end=float(rel[-1]),
        )


def _lrs(log: Path) -> list[float]:
    if not log.exists():
        return []
    with log.open() as f:
        return [float(r["lr"]) for r in csv.DictReader(f)]


def lr_sum(log: Path) -> float | None:
    lrs = _lrs(log)
    return sum(lrs) if lrs else None


def decay_factor(log: Path, weight_decay: float) -> float | None:
    total = lr_sum(log)
    return math.exp(-weight_decay * total) if total is not None else None


def whole_ratio(total: int, layers: list[dict[str, Any]]) -> float:
    """full / current over every parameter, as abtrain.method.lowrank.parameter_counts counts."""
    current = total - sum(r["w_params"] - r["ab_params"] for r in layers)
    return total / current


def collect(
    run_dir: Path, shapes: dict[str, list[int]] | None = None, total: int | None = None
) -> dict[str, Any]:
    """One run's entry; `shapes`/`total` skip building the model (tests)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    cfg = json.loads((run_dir / "config.json").read_text())
    if shapes is None or total is None:
        shapes, total = layer_shapes(cfg)
    facts = summary["factorizations"]
    layers = per_layer(shapes, facts[-1]["ranks"] if facts else {})
    ratio = summary["compression_ratio"]
    spectra(run_dir / "model.pt", layers, cfg["ab"]["sigma_cutoff"])
    if not math.isclose(whole_ratio(total, layers), ratio, rel_tol=1e-6):
        raise ValueError(
            f"{run_dir}: compression from the layer shapes {whole_ratio(total, layers):.6f} "
            f"!= the summary's {ratio:.6f}"
        )
    m = cfg["model"]
    size = {**m, **m.get("kwargs", {})}  # the sizes: model keys, or a factory's arguments
    shown = [f"{k} {size[k]}" for k in ("width", "embed_dim", "depth") if k in size]
    return dict(
        model=label(m) + (f" ({', '.join(shown)})" if shown else ""),
        method=summary["method"],
        world_size=summary["world_size"],
        nodes=summary["nodes"],
        steps=summary["steps"],
        batch_per_rank=cfg["batch_size"],
        global_batch=cfg["batch_size"] * summary["world_size"],
        lr=cfg["optim"]["lr"],
        ab=cfg["ab"],
        params_full=total,
        params_current=round(total / ratio),
        val_top1_best=summary["val_top1"]["best"],
        val_top1_final=summary["val_top1"]["final"],
        compression_ratio=ratio,
        wall_seconds=summary["wall_seconds"],
        time_share=summary.get("time", {}).get("share"),
        inter_node_bytes_per_rank=summary["traffic"]["inter_node_bytes"],
        # AdamW's decoupled decay over the run: a direction no gradient reaches shrinks
        # by exp(-wd * sum of the step LRs); ortho_sigma starts every sigma at 1
        weight_decay=cfg["optim"]["weight_decay"],
        lr_sum=lr_sum(run_dir / "train_log.csv"),
        decay_factor=decay_factor(run_dir / "train_log.csv", cfg["optim"]["weight_decay"]),
        # the final weights factorised at the cutoff (a DDP run's too): what they'd give
        compression_if_cut_at_end=(
            whole_ratio(total, [dict(r, ab_params=r["ab_params_at_end"]) for r in layers])
            if layers and "ab_params_at_end" in layers[0]
            else None
        ),
        evals=[dict(step=e["step"], val_top1=e["val_top1"]) for e in summary["evals"]],
        factorizations=[
            dict(
                step=f["step"],
                compression_ratio=f["compression_ratio"],
                rank_min=min(f["ranks"].values()),
                rank_max=max(f["ranks"].values()),
                ranks=f["ranks"],
            )
            for f in facts
        ],
        layers=layers,
    )


def table(runs_dir: Path, names: tuple[str, ...] = RUNS + EXTRA, **kw: Any) -> dict[str, Any]:
    runs = {
        n: collect(runs_dir / n, **kw) for n in names if (runs_dir / n / "summary.json").exists()
    }
    for run in runs.values():  # Δ top-1 against the DDP run of the same model
        ddps = [r for r in runs.values() if r["method"] == "ddp" and r["model"] == run["model"]]
        same = [r for r in ddps if r["weight_decay"] == run["weight_decay"]]
        base = (same or ddps or [None])[0]
        if base is not None and base["weight_decay"] != run["weight_decay"]:
            run["baseline_note"] = f"against DDP at weight decay {base['weight_decay']}"
        run["delta_top1_best"] = (
            round(run["val_top1_best"] - base["val_top1_best"], 2) if base else None
        )
        run["delta_top1_final"] = (
            round(run["val_top1_final"] - base["val_top1_final"], 2) if base else None
        )
    return dict(runs=runs, paper_vgg16=PAPER, chance_top1=100 / CLASSES)


def figure(data: dict[str, Any], path: Path) -> None:
    """Compression and top-1 against the step, and the last ranks per layer. A run has its
    method's colour and marker (pipeline.style, as in every figure); runs of one method
    differ by line: solid VGG16, dashed VGG16 at the raised weight decay (open markers,
    hatched bars), dash-dot the ViT."""
    from pipeline import style

    def look(name: str, run: dict[str, Any]) -> dict[str, Any]:
        wd = name.endswith("-wd")
        ls = "--" if wd else "-" if "vgg" in run["model"] else "-."
        kw = style.marker(run["method"])
        kw.update(ms=0.6 * kw["ms"], ls=ls, lw=1.3, mfc="white" if wd else kw["color"])
        return kw

    with style.matplotlib_defaults() as plt:
        fig, (ax1, ax2, ax3) = plt.subplots(
            1,
            3,
            figsize=(17, 5.2),
            gridspec_kw=dict(width_ratios=[1, 1, 1.2]),
            layout="constrained",
        )
        for name, run in data["runs"].items():
            ev = run["evals"]
            ax2.plot(
                [e["step"] for e in ev],
                [e["val_top1"] for e in ev],
                label=f"{name} ({run['method']})",
                **look(name, run),
            )
            f = run["factorizations"]
            if f:
                ax1.step(
                    [x["step"] for x in f],
                    [x["compression_ratio"] for x in f],
                    where="post",
                    label=name,
                    **look(name, run),
                )
        ax1.axhline(1.0, color="grey", lw=0.8, ls="--", zorder=1)
        ax1.set(
            xlabel="step (factorisation)",
            ylabel="compression full:current",
            title="compression ratio at each factorisation (AB runs)",
        )
        ax2.axhline(data["chance_top1"], color="grey", lw=0.8, ls="--", label="chance", zorder=1)
        ax2.set(xlabel="step", ylabel="val top-1 (%)", title="validation top-1")
        # per layer, the VGG16 AB runs' last factorisation: rank / full rank of the matrix view
        vggs = {
            n: r for n, r in data["runs"].items() if r["method"] == "ab" and "vgg" in r["model"]
        }
        width = 0.8 / max(1, len(vggs))
        for j, (name, r) in enumerate(vggs.items()):
            rows = r["layers"]
            xs = [i + (j - (len(vggs) - 1) / 2) * width for i in range(len(rows))]
            wd = name.endswith("-wd")
            c = style.colour(r["method"])
            ax3.bar(
                xs,
                [x["rank"] / x["full_rank"] for x in rows],
                width,
                label=name,
                color="white" if wd else c,
                edgecolor=c,
                hatch="////" if wd else None,
            )
            for x, row in zip(xs, rows):
                if row["rank"] == row["full_rank"]:
                    continue  # a full bar says it: only the cut ranks are written
                ax3.text(
                    x,
                    row["rank"] / row["full_rank"] + 0.02,
                    str(row["rank"]),
                    ha="center",
                    fontsize=8,
                    rotation=90,
                )
            ax3.set_xticks(range(len(rows)), [x["layer"] for x in rows], rotation=70, fontsize=7)
        ax3.set(
            ylim=(0, 1.25),
            ylabel="rank / full rank",
            title="VGG16 AB runs: ranks at the last factorisation\n(cut ranks written; a bar "
            "at 1 keeps the full rank)",
        )
        ax3.legend(fontsize=8, loc="upper left", ncol=2)  # above the bars (ylim 1.25)
        for ax in (ax1, ax2):
            ax.grid(alpha=0.3)
        # legends under the panels: the curves fill the panels' corners
        for ax, ncol in ((ax1, 3), (ax2, 2)):
            ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=ncol)
        style.save(fig, path, dpi=110)


def markdown(data: dict[str, Any]) -> str:
    """The report's tables, from the JSON (reports/table2/README.md quotes them)."""
    runs, p = data["runs"], data["paper_vgg16"]
    rows = [
        [
            r["model"],
            f"{r['method']} (`{name}`)",
            f"{r['steps']} x {r['global_batch']}, lr {r['lr']:g}, wd {r['weight_decay']:g}",
            f"{r['val_top1_best']:.2f}% / {r['val_top1_final']:.2f}%",
            f"{r['delta_top1_best']:+.2f} / {r['delta_top1_final']:+.2f} pts"
            if r["delta_top1_best"] is not None and r["method"] != "ddp"
            else md.DASH,
            f"{r['compression_ratio']:.2f}:1 ({r['params_full']:,} / {r['params_current']:,})",
            f"{r['wall_seconds'] / 60:.1f} min",
        ]
        for name, r in runs.items()
    ]
    rows.append(
        [
            "paper: VGG16 (timm, width 64)",
            "AB",
            f"{p['steps']} x {p['global_batch']}, lr {p['lr']:g}, wd {p['weight_decay']:g}",
            f"{p['max_top1']}% (max)",
            f"{p['delta_top1']:+.2f}%",
            f"{p['compression_ratio']}:1",
            md.DASH,
        ]
    )
    out = md.table(
        ["model", "method", "steps x global batch, peak lr, weight decay"]
        + ["val top-1 best / final", "Δ top-1 vs DDP (best / final)"]
        + ["compression full:current", "wall"],
        rows,
    )
    out += ["", "Compression at each factorisation (step: ratio, ranks min-max):", ""]
    for name, r in runs.items():
        if r["factorizations"]:
            steps = ", ".join(
                f"{f['step']}: {f['compression_ratio']:.2f} ({f['rank_min']}-{f['rank_max']})"
                for f in r["factorizations"]
            )
            out.append(f"- `{name}`: {steps}")
    for name, r in runs.items():
        if not r["layers"]:
            continue
        out += [
            "",
            f"Per layer, `{name}` (matrix view out x in·kh·kw; rank of the last factorisation"
            " or full; the rank the cutoff would keep on the final weights, and their median"
            " and smallest σ/σ_max):",
            "",
            *md.table(
                ["layer", "weight shape", "matrix", "rank (full)", "W params", "A+B params"]
                + ["W:(A+B)", "rank at end", "σ median / min"],
                (layer_row(row) for row in r["layers"]),
            ),
        ]
    return "\n".join(out) + "\n"


def layer_row(row: dict[str, Any]) -> list[str]:
    """One layer's line of a run's per-layer table."""
    k = row["rank"] if row["rank"] is not None else "full"
    end = [md.DASH, md.DASH]
    if "rank_at_end" in row:
        median, least = row["sigma_median_rel_at_end"], row["sigma_min_rel_at_end"]
        end = [str(row["rank_at_end"]), f"{median:.3f} / {least:.3f}"]
    return [
        row["layer"],
        "x".join(map(str, row["shape"])),
        f"{row['matrix'][0]}x{row['matrix'][1]}",
        f"{k} ({row['full_rank']})",
        f"{row['w_params']:,}",
        f"{row['ab_params']:,}",
        f"{row['ratio']:.2f}",
        *end,
    ]


# ---------------------------------------------------------------- the study
@dataclass
class Table2(study.Study):
    """The study on the skeleton: five runs, a record, a figure and the tables (the
    README around them is written by hand; no generated sentence)."""

    name, record, keys = "table2", "table2.json", ("runs", "paper_vgg16", "chance_top1")
    figure_file, page_file, indent = "table2.png", "tables.md", 1
    basis = "the committed runs' times"

    runs_dir: Path = RUNS_DIR

    def runs(self) -> list[Run]:
        path = self.out / self.record
        committed = read_record(path, ("runs",))["runs"] if path.exists() else {}
        return list_runs(self.runs_dir, committed)

    def aggregate(self, runs: list[Run]) -> dict[str, Any]:
        data = table(self.runs_dir)
        if not data["runs"]:
            raise SystemExit(f"no finished run (summary.json) under {self.runs_dir}")
        return data

    def figure(self, data: dict[str, Any], path: Path) -> None:
        figure(data, path)  # the module's

    def page(self, data: dict[str, Any]) -> str:
        return markdown(data)

    def closing(self, data: dict[str, Any]) -> str:
        return "\n".join(
            f"{name:10s} {r['method']:4s} top1 best {r['val_top1_best']:.2f} final "
            f"{r['val_top1_final']:.2f} d {r['delta_top1_best']} compression "
            f"{r['compression_ratio']:.2f}:1 wall {r['wall_seconds']:.0f}s"
            for name, r in data["runs"].items()
        )


def main(argv: list[str] | None = None) -> int:
    ap = parser("bench.table2", __doc__)
    study.options(ap, RUNS_DIR, OUT, runs_flags=("--runs",))
    a = ap.parse_args(argv)
    return study.conduct(Table2(a.out, runs_dir=a.runs_dir), a)


if __name__ == "__main__":
    raise SystemExit(stage(main, who="bench"))
