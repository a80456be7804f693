"""Is it the method or the short training? The default profile's ddp, ab, powersgd and
ab_powersgd at several training lengths, several seeds each: AB's gap to DDP, its
compression and its traffic over length.

    python -m bench.lengths --dry-run       # the runs and their estimated time; trains nothing
    python -m bench.lengths                 # train (a killed study continues), then report
    python -m bench.lengths --report-only   # rebuild reports/lengths from runs/lengths
    python -m bench.lengths --render        # redraw page, figure, verdict from lengths.json

A study on bench.study's skeleton (plan, estimate, resume, ETA, record, figure, page). Each
run is the matrix's run of its method on 2 nodes x 2 ranks (`experiments.runs`, made into
overrides by pipeline.matrix with `experiments.epochs` set to the length: its steps, the
schedule's fractions of them, the search's best values, the run's own `set`), at `seed=S`,
evaluated EVALUATIONS times, tracking off; launched as the pipeline launches it. A run
whose folder is gone but whose row the committed lengths.json holds (made with the same
model, shape and evaluations) is taken from there: run folders stay on the machine that
trained them, so a clone adds a method or a seed by training only those runs. Seeds go
seed by seed within a length, shortest length first, so a study cut short has whole
ddp/method pairs.

Writes reports/lengths/lengths.json (every run's figures and the summary), README.md and
lengths.png; the report's verdict takes its sentence (`verdict`) from lengths.json.
"""

from __future__ import annotations

import copy
import csv
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from abtrain.files import read_record
from bench import study
from bench.network import step_times
from bench.study import Run
from pipeline.report.markdown import DASH, pm, table
from pipeline.stage import STUDY_STOPPED, parser, stage

# 1 to 16 epochs spans the 16x the question needs; with the four methods it fits ~2.1 h of 2
# cores (2 to 32 epochs would take ~5 h).
LENGTHS = (1, 4, 16)  # epochs of the profile's training set
SEEDS = (3, 3, 2)  # per length: seeds train.seed, +1, ...
METHODS = ("ddp", "ab", "powersgd", "ab_powersgd")  # ddp first: the baseline
SHAPE = (2, 2)  # nodes x ranks per node, the matrix's main scale
EVALUATIONS = 8  # per run: enough points for the time to a target
RUNS_DIR = Path("runs/lengths")
OUT = Path("reports/lengths")
LAUNCH_SECONDS = study.LAUNCH_SECONDS
RATES = ("50mbit", "200mbit", "1gbit", None)  # bench.network's links, for the time to target


# ---------------------------------------------------------------- the plan
def list_runs(
    p: dict[str, Any],
    best: dict[str, Any] | None,
    lengths: tuple[int, ...],
    seeds: tuple[int, ...],
    methods: tuple[str, ...],
    runs_dir: Path,
    shape: tuple[int, int] = SHAPE,
) -> list[Run]:
    """Every run of the study, in the order it trains, each the profile's run of its
    method at `shape` (nodes, ranks per node); run["epochs"], ["seed"], ["method"] and
    ["matrix"] (its run of experiments.runs)."""
    from pipeline.matrix import run_of, run_overrides

    out = []
    for epochs, count in zip(lengths, seeds):
        q = copy.deepcopy(p)
        q["experiments"].update(epochs=epochs, evaluations=EVALUATIONS)
        for seed in range(p["train"]["seed"], p["train"]["seed"] + count):
            for method in methods:
                run = run_of(p, method, *shape)
                out.append(
                    Run(
                        name=f"{run.name} at {epochs} epochs, seed {seed}",
                        folder=runs_dir / f"e{epochs}" / f"{run.name}-s{seed}",
                        sets=run_overrides(q, run, best)
                        + [f"seed={seed}", "tracking.enabled=false"],
                        nodes=run.nodes,
                        ranks_per_node=run.ranks_per_node,
                        info=dict(epochs=epochs, seed=seed, method=method, matrix=run),
                    )
                )
    return out


def estimate(p: dict[str, Any], runs: list[Run], results: Path) -> list[float]:
    """Each run's seconds, before it runs: its matrix run's committed training time
    (results/NAME.json) scaled by the length, plus start-up."""
    base = p["experiments"]["epochs"]
    return [study.matrix_seconds(r["matrix"].name, results, r["epochs"] / base) for r in runs]


def recorded(out: Path, p: dict[str, Any], shape: tuple[int, int]) -> dict[tuple, dict]:
    """The rows of the committed study in `out` by (epochs, seed, method), if it was made
    with this profile's model, `shape` and EVALUATIONS (else none: its runs differ)."""
    path = out / "lengths.json"
    if not path.exists():
        return {}
    data = read_record(path, ("runs",))
    same = (data.get("model"), data.get("shape"), data.get("evaluations"))
    if same != (p["train"]["model"], list(shape), EVALUATIONS):
        return {}
    return {key(r): r for r in data["runs"]}


def key(r: Run | dict[str, Any]) -> tuple[int, int, str]:
    """A run of the study, in the plan or as a row."""
    return r["epochs"], r["seed"], r["method"]


# ---------------------------------------------------------------- what the runs give
def kept_fraction(out: Path) -> list[tuple[int, float]]:
    """(step, kept rank over full rank, summed over the factorised layers) at each
    factorisation, from ranks.csv; [] for a run without AB phases."""
    path = out / "ranks.csv"
    if not path.exists():
        return []
    by: dict[int, list[int]] = {}
    for row in csv.DictReader(path.open()):
        kept, full = by.setdefault(int(row["step"]), [0, 0]), int(row["full_rank"])
        kept[0] += int(row["rank"])
        kept[1] += full
    return [(step, k / f) for step, (k, f) in sorted(by.items())]


def collect(runs: list[Run], recorded_rows: dict[tuple, dict] | None = None) -> list[dict]:
    """One row per finished run: its figures, curve, step times and compression over steps;
    from its folder, or else as `recorded_rows` has it (the committed study's row)."""
    rows = []
    for r in runs:
        path = r.folder / "summary.json"
        if not path.exists():
            if key(r) in (recorded_rows or {}):
                rows.append(recorded_rows[key(r)])
            continue
        s = json.loads(path.read_text())
        rows.append(
            dict(
                epochs=r["epochs"],
                seed=r["seed"],
                method=r["method"],
                name=r["matrix"].name,
                nodes=r.nodes,
                ranks_per_node=r.ranks_per_node,
                folder=str(r.folder),
                steps=s["steps"],
                best_top1=s["val_top1"]["best"],
                final_top1=s["val_top1"]["final"],
                inter_node_bytes=s["traffic"]["inter_node_bytes"],
                compression_ratio=s["compression_ratio"],
                compression_over_steps=[
                    (f["step"], f["compression_ratio"]) for f in s.get("factorizations", [])
                ],
                kept_fraction_over_steps=kept_fraction(r.folder),
                wall_seconds=s["wall_seconds"],
                evals=[
                    dict(step=e["step"], seconds=e["seconds"], val_top1=e["val_top1"])
                    for e in s["evals"]
                ],
                step_seconds=step_times(r.folder),  # bench.network's measure
            )
        )
    return rows


def mean_sd(values: list[float]) -> dict[str, Any]:
    return dict(
        n=len(values),
        mean=statistics.fmean(values),
        sd=statistics.stdev(values) if len(values) > 1 else None,
    )


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per length and method: Δ best top-1 against ddp at the same seed (mean ± sd), the
    inter-node bytes over ddp's, the final compression and kept rank fraction."""
    out = []
    for epochs in sorted({r["epochs"] for r in rows}):
        here = [r for r in rows if r["epochs"] == epochs]
        ddp = {r["seed"]: r for r in here if r["method"] == "ddp"}
        methods = {}
        for method in dict.fromkeys(r["method"] for r in here):
            mine = [r for r in here if r["method"] == method]
            paired = [r for r in mine if r["seed"] in ddp]
            kept = [
                r["kept_fraction_over_steps"][-1][1] for r in mine if r["kept_fraction_over_steps"]
            ]
            methods[method] = dict(
                seeds=[r["seed"] for r in mine],
                best_top1=mean_sd([r["best_top1"] for r in mine]),
                diff_top1=mean_sd([r["best_top1"] - ddp[r["seed"]]["best_top1"] for r in paired])
                if paired
                else None,
                diff_final=mean_sd([r["final_top1"] - ddp[r["seed"]]["final_top1"] for r in paired])
                if paired
                else None,
                bytes_vs_ddp=statistics.fmean(
                    r["inter_node_bytes"] / ddp[r["seed"]]["inter_node_bytes"] for r in paired
                )
                if paired
                else None,
                compression_ratio=statistics.fmean(r["compression_ratio"] for r in mine),
                kept_fraction=statistics.fmean(kept) if kept else None,
            )
        out.append(dict(epochs=epochs, steps=here[0]["steps"], methods=methods))
    return out


def time_to_target(rows: list[dict[str, Any]], epochs: int, runs: list[Run]) -> dict | None:
    """At `epochs` (first seed's runs): the target, the lowest best top-1 smoothed as
    bench.rates smooths it, and each method's predicted seconds to it over each of the
    benchmark's links (abtrain.predict.timing.ToTarget, the project's one time model; these runs
    ran over loopback, the unshaped link)."""
    from abtrain import config as abconfig
    from abtrain.predict.timing import ToTarget
    from bench.paper_scale import rate_bytes_per_s
    from bench.rates import best, reach

    first = min(r["seed"] for r in rows if r["epochs"] == epochs)
    mine = [r for r in rows if r["epochs"] == epochs and r["seed"] == first]
    if not mine:
        return None
    target = min(best(r["evals"]) for r in mine)
    sets = {key(r): r["sets"] for r in runs}  # each run's config, as it was launched
    found: dict[str, dict[str, float | None]] = {}
    for r in mine:
        got = reach(r["evals"], target)
        cfg = abconfig.load(Path("params.yaml"), sets[key(r)])
        shape = (r["nodes"], r["ranks_per_node"])
        model = ToTarget(cfg, *shape, classes(cfg), r, got["step"]) if got else None
        found[r["method"]] = {
            rate or "unshaped": (
                model.seconds(rate_bytes_per_s(rate) if rate else None) if model else None
            )
            for rate in RATES
        }
    return dict(epochs=epochs, seed=first, target_top1=target, seconds=found)


def timed_together(
    rows: list[dict[str, Any]], recorded_rows: dict[tuple, dict]
) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows whose times compare, and the methods left out: a study continued in a
    later session mixes two machines' (or two loads') step times, which a time to target
    must not set side by side. The runs trained now if ddp is among them, else the recorded
    ones."""
    fresh = [r for r in rows if key(r) not in recorded_rows]
    old = [r for r in rows if key(r) in recorded_rows]
    pick = fresh if not old or any(r["method"] == "ddp" for r in fresh) else old
    left = {r["method"] for r in rows} - {r["method"] for r in pick}
    return pick, [m for m in dict.fromkeys(r["method"] for r in rows) if m in left]


def classes(cfg: Any) -> int:
    from abtrain.commands.preflight import data_classes

    return data_classes(cfg)[0]


# ---------------------------------------------------------------- the verdict and the page
def change_word(short: dict[str, Any], long: dict[str, Any], method: str = "ab") -> str:
    """Whether `method`'s gap to DDP narrows, holds or widens from one length to another: a
    change larger than the two gaps' sds together is a change."""
    a, b = short["methods"][method]["diff_top1"], long["methods"][method]["diff_top1"]
    noise = (a["sd"] or 0.0) + (b["sd"] or 0.0)
    change = b["mean"] - a["mean"]  # > 0: AB nearer DDP (or further above it)
    if abs(change) <= noise:
        return "holds"
    return "narrows" if (change > 0) == (a["mean"] < 0) else "widens"


def trend(summary: list[dict[str, Any]]) -> dict[str, Any] | None:
    """AB's gap over the whole range: the word from each length to the longest. Where the
    words agree, that word from the shortest; where they don't, the shortest point alone
    decides the word, so the trend is the one from the next length on (`alone`: the
    shortest and what it alone would say)."""
    have = [s for s in summary if s["methods"].get("ab", {}).get("diff_top1")]
    if len(have) < 2:
        return None
    long = have[-1]
    words = [change_word(s, long) for s in have[:-1]]
    if all(w == words[0] for w in words):
        return dict(short=have[0], long=long, word=words[0], alone=None)
    return dict(short=have[1], long=long, word=words[1], alone=(have[0], words[0]))


def verdict(summary: list[dict[str, Any]]) -> str:
    """The study in a few sentences, every number from its files: the gap's trend over the
    whole range (with its seeds), the final top-1's beside the best's, and at the longest
    length the compression with its cause."""
    t = trend(summary)
    if t is None:
        return "Too few lengths with paired ab and ddp runs for a trend."
    short, long = t["short"], t["long"]
    a, b = short["methods"]["ab"], long["methods"]["ab"]
    said = (
        f"From {short['epochs']} to {long['epochs']} epochs AB's gap to DDP {t['word']} "
        f"({pm(a['diff_top1'])} to {pm(b['diff_top1'])} points of best top-1, "
        f"{a['diff_top1']['n']} and {b['diff_top1']['n']} seeds"
    )
    if a.get("diff_final") and b.get("diff_final"):
        said += f"; of final top-1 {pm(a['diff_final'])} to {pm(b['diff_final'])}"
    said += ")"
    if t["alone"]:
        first, word = t["alone"]
        said += (
            f"; only the {first['epochs']}-epoch point ({first['steps']} steps, "
            f"{pm(first['methods']['ab']['diff_top1'])}) would make it {word[:-1]}"
        )
    kept = f", {b['kept_fraction']:.0%} of the rank kept" if b["kept_fraction"] else ""
    said += f". At {long['epochs']} epochs AB " + (
        f"compresses the model {b['compression_ratio']:.2f}:1{kept}."
        if b["compression_ratio"] > 1.0
        else f"does not compress ({b['compression_ratio']:.2f}:1{kept})"
    )
    if b["compression_ratio"] <= 1.0 and b.get("decay_left") is not None:
        said += (
            f": at weight decay {b['weight_decay']:.2g} decay alone leaves "
            f"{b['decay_left']:.3f} of a singular value over the run, far above the "
            f"{b['sigma_cutoff']:.2f} cutoff (ortho-σ starts every σ at 1), so no rank falls."
        )
    elif b["compression_ratio"] <= 1.0:
        said += "."
    return said


def add_decay(summary: list[dict[str, Any]], p: dict[str, Any], shape: tuple[int, int]) -> None:
    """Each length's AB run: its weight decay, cutoff and what decay alone leaves of a
    singular value over it (abtrain.method.schedule.decay_left), from params.yaml and the search's
    committed best, as the study's runs were made."""
    from abtrain import config as abconfig
    from abtrain.method.schedule import decay_left
    from pipeline.matrix import best_config

    best = best_config(p)
    for s in summary:
        ab = s["methods"].get("ab")
        if not ab:
            continue
        run = list_runs(p, best, (s["epochs"],), (1,), ("ab",), RUNS_DIR, shape)[0]
        cfg = abconfig.from_dict(p["train"], run.sets)
        ab.update(
            weight_decay=cfg.optim.weight_decay,
            sigma_cutoff=cfg.ab.sigma_cutoff,
            decay_left=decay_left(cfg),
        )


def figure(data: dict[str, Any], path: Path) -> None:
    """Four panels, two by two, legible at the page's width: Δ best top-1 against length
    (each method a little apart on x so the error bars don't overlap, each point's seeds
    written in its legend); bytes over DDP's against length; AB's compression and kept rank
    over each run (one panel; said in words where they are one constant); the time to the
    target over the links at the longest length (a method without a prediction named)."""
    from pipeline import style

    summary, rows = data["summary"], data["runs"]
    with style.matplotlib_defaults() as plt:
        fig, axes = plt.subplots(2, 2, figsize=(12, 8.4))
        delta, sent, ranks, timed = axes[0, 0], axes[0, 1], axes[1, 0], axes[1, 1]
        lengths = [s["epochs"] for s in summary]
        methods = [
            m for m in style.METHODS if m != "ddp" and any(m in s["methods"] for s in summary)
        ]
        shift = style.offsets(methods, 0.09)  # in log2 units of epochs
        for m in methods:
            pts = [(s["epochs"], s["methods"][m]) for s in summary if s["methods"].get(m)]
            pts = [(e, x) for e, x in pts if x["diff_top1"]]
            look = style.marker(m)
            look.pop("zorder")
            xs = [e * 2 ** shift[m] for e, _ in pts]
            ys = [x["diff_top1"]["mean"] for _, x in pts]
            # the seeds of each point in the legend, in the order of the lengths: written
            # beside the points, the labels of the methods at one length covered each other
            seeds = "/".join(str(x["diff_top1"]["n"]) for _, x in pts)
            delta.errorbar(
                xs, ys, yerr=[x["diff_top1"]["sd"] or 0 for _, x in pts],
                label=f"{m} (n = {seeds})", capsize=3, **look,
            )  # fmt: skip
            sent.plot([e for e, _ in pts], [x["bytes_vs_ddp"] for _, x in pts], label=m, **look)
        delta.axhline(0, color="grey", lw=0.8)
        for a, title in (
            (delta, "Δ best top-1 vs DDP (mean ± sd over n seeds per length)"),
            (sent, "inter-node bytes / DDP's"),
        ):
            a.set_xscale("log", base=2)
            a.set_xticks(lengths, [str(x) for x in lengths])
            a.set_xlabel("epochs")
            a.set_title(title)
        delta.legend(loc="lower left")  # its points start at the top left, by the zero line
        sent.legend()
        sent.set_ylim(0, None)
        first = {
            r["epochs"]: r for r in rows if r["method"] == "ab" and r["compression_over_steps"]
        }
        values = {c for r in first.values() for _, c in r["compression_over_steps"]}
        kept = {k for r in first.values() for _, k in r["kept_fraction_over_steps"]}
        if len(values) == 1 and len(kept) == 1:  # one number: said, not drawn as lines
            ranks.axis("off")
            ranks.text(
                0.5, 0.5,
                f"ab: compression {values.pop():.2f}:1 and {kept.pop():.0%} of the rank kept\n"
                f"at every factorisation of every length\n({', '.join(map(str, sorted(first)))} "
                "epochs): no singular value\nfell below the cutoff",
                ha="center", va="center", fontsize=12, transform=ranks.transAxes,
            )  # fmt: skip
        else:
            for epochs, r in sorted(first.items()):
                label = f"{epochs} epoch{'s' * (epochs != 1)}"
                pts = r["compression_over_steps"]
                ranks.plot(
                    [s / r["steps"] for s, _ in pts], [c for _, c in pts], marker="o", label=label
                )
            ranks.axhline(1, color="grey", lw=0.8)
            ranks.set_xlabel("fraction of the run")
            ranks.set_title("ab: compression ratio at each factorisation")
            ranks.legend()
        tt = data.get("time_to_target")
        if tt:
            labels = [r or "unshaped" for r in RATES]
            methods = list(tt["seconds"])
            width = 0.8 / len(methods)
            for i, m in enumerate(methods):
                ys = [tt["seconds"][m][x] or 0 for x in labels]
                timed.bar(
                    [j + i * width for j in range(len(labels))], ys, width, label=m,
                    color=style.COLOURS.get(m),
                )  # fmt: skip
            timed.set_xticks([j + 0.4 - width / 2 for j in range(len(labels))], labels)
            timed.set_ylabel("seconds")
            timed.set_title(
                f"time to {tt['target_top1']:.1f}% top-1 at {tt['epochs']} epochs (time model)"
            )
            timed.legend()
            if tt.get("left_out"):
                timed.text(
                    0.98, 0.62, f"not predicted: {', '.join(tt['left_out'])}\n(see the page)",
                    ha="right", fontsize=9, color="grey", transform=timed.transAxes,
                )  # fmt: skip
        fig.tight_layout()
        style.save(fig, path, dpi=110)


def markdown(data: dict[str, Any]) -> str:
    rows = [
        [
            s["epochs"],
            s["steps"],
            m,
            len(x["seeds"]),
            pm(x["best_top1"]).lstrip("+"),
            pm(x["diff_top1"]) if x["diff_top1"] and m != "ddp" else DASH,
            f"{x['bytes_vs_ddp']:.3f}",
            f"{x['compression_ratio']:.2f}:1",
            f"{x['kept_fraction']:.0%}" if x["kept_fraction"] is not None else DASH,
        ]
        for s in data["summary"]
        for m, x in s["methods"].items()
    ]
    lines = [
        "# AB against DDP and PowerSGD over training length",
        "",
        f"Generated by `{data['command']}` on {data['generated']}. Each run is the default "
        f"profile's {data['shape'][0]} × {data['shape'][1]} run of its method with `experiments.epochs` set to "
        f"the length, the search's values and {EVALUATIONS} evaluations; run folders in "
        f"`{data['runs_dir']}`, every figure in `lengths.json`. Two things the length does "
        "not scale: an evaluation waits for a sync in AB's phases, so AB is evaluated fewer "
        "times than DDP (which favours DDP's best-of-evaluations; the verdict gives the final "
        "top-1's gap beside it), and PowerSGD's `start_iter` is the profile's fixed step "
        "count at every length.",
        "",
        f"**{data['verdict']}**",
        "",
        "![Δ top-1, compression, bytes and time to target over length](lengths.png)",
        "",
        *table(
            ["epochs", "steps", "method", "seeds", "best top-1 (%)", "Δ vs DDP (points)"]
            + ["bytes / DDP's", "compression", "kept rank"],
            rows,
        ),
    ]
    tt = data.get("time_to_target")
    if tt:
        links = [r or "unshaped" for r in RATES]
        lines += [
            "",
            f"Time to {tt['target_top1']:.2f}% top-1 at {tt['epochs']} epochs (seed "
            f"{tt['seed']}), predicted by the time model (`abtrain.predict.timing.ToTarget`) over the "
            "network benchmark's links, seconds:",
            "",
            *table(
                ["method", *links],
                (
                    [m, *(f"{by[x]:.0f}" if by[x] else DASH for x in links)]
                    for m, by in tt["seconds"].items()
                ),
            ),
        ]
        if tt.get("left_out"):
            lines += [
                "",
                f"Not in this table: {', '.join(tt['left_out'])}, whose runs were trained in "
                "another session than ddp's, on a machine whose speed differed; step times of "
                "two sessions do not compare.",
            ]
    lines += [
        "",
        "Δ: best top-1 minus DDP's at the same seed, mean ± sample sd over the seeds. "
        "Compression: parameters of the full model over the factorised one's at the run's end "
        "(below 1: the factors hold more than the matrix). Kept rank: the factorised layers' "
        "kept rank over their full rank at the last factorisation.",
        "",
        "Reproduce (resumes where it stopped):",
        "",
        "```bash",
        data["command"],
        "```",
        "",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------- the study
@dataclass
class Lengths(study.Study):
    """The study on the skeleton: its runs, the rows the committed record already holds,
    and its record, sentence, figure and page."""

    name, record, keys = "lengths", "lengths.json", ("runs",)
    figure_file = "lengths.png"
    basis = "the matrix's run times x length"

    p: dict[str, Any] = field(default_factory=dict)  # params.yaml
    lengths: tuple[int, ...] = LENGTHS
    seeds: tuple[int, ...] = SEEDS
    methods: tuple[str, ...] = METHODS
    runs_dir: Path = RUNS_DIR
    shape: tuple[int, int] = SHAPE

    def __post_init__(self) -> None:
        self.rows = recorded(self.out, self.p, self.shape)  # the committed study's, by key

    def runs(self) -> list[Run]:
        from pipeline.matrix import best_config

        runs = list_runs(
            self.p, best_config(self.p), self.lengths, self.seeds, self.methods,
            self.runs_dir, self.shape,
        )  # fmt: skip
        for r, seconds in zip(runs, estimate(self.p, runs, Path("results"))):
            r.seconds = seconds
        return runs

    def found(self, run: Run) -> str | None:
        return super().found(run) or ("lengths.json" if key(run) in self.rows else None)

    def aggregate(self, runs: list[Run]) -> dict[str, Any]:
        rows = collect(runs, self.rows)
        longest = max((r["epochs"] for r in rows), default=None)
        tt = None
        if longest:
            timed, left = timed_together([r for r in rows if r["epochs"] == longest], self.rows)
            tt = time_to_target(timed, longest, runs)
            if tt and left:
                tt["left_out"] = left
        summary = summarize(rows)
        add_decay(summary, self.p, self.shape)
        return dict(
            generated=study.stamp(),
            command=self.command,
            runs_dir=str(self.runs_dir),
            shape=list(self.shape),
            model=self.p["train"]["model"],  # the report names a study of another model apart
            evaluations=EVALUATIONS,
            summary=summary,
            time_to_target=tt,
            runs=rows,
        )

    def refresh(self, data: dict[str, Any]) -> dict[str, Any]:
        # the time to target needs the runs' configs: it stays as the record has it
        data["summary"] = summarize(data["runs"])
        add_decay(data["summary"], self.p, tuple(data["shape"]))  # the record's, not --shape
        return data

    def sentence(self, data: dict[str, Any]) -> str:
        return verdict(data["summary"])

    def figure(self, data: dict[str, Any], path: Path) -> None:
        figure(data, path)  # the module's

    def page(self, data: dict[str, Any]) -> str:
        return markdown(data)


def main(argv: list[str] | None = None) -> int:
    ap = parser("bench.lengths", __doc__)
    ap.add_argument("--epochs", type=int, nargs="+", default=list(LENGTHS))
    ap.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS), help="per length")
    ap.add_argument("--methods", nargs="+", default=list(METHODS))
    ap.add_argument(
        "--shape", default="x".join(map(str, SHAPE)), help="nodes x ranks per node of every run"
    )
    study.options(ap, RUNS_DIR, OUT)
    a = ap.parse_args(argv)
    if len(a.seeds) != len(a.epochs) or a.methods[0] != "ddp":
        ap.error("give one seed count per length, and ddp first (the baseline)")
    try:
        nodes, per_node = (int(x) for x in a.shape.split("x"))
    except ValueError:
        ap.error(f"--shape {a.shape}: give nodes x ranks per node, e.g. 2x2")
    from pipeline.stage import params

    lengths = Lengths(
        a.out, study.shown("bench.lengths", argv), params(), tuple(a.epochs), tuple(a.seeds),
        tuple(a.methods), a.runs_dir, (nodes, per_node),
    )  # fmt: skip
    return study.conduct(lengths, a)


if __name__ == "__main__":
    raise SystemExit(stage(main, who="bench", stopped=STUDY_STOPPED))
