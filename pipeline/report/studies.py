"""The report's sections on the studies beside the matrix: the seed studies (bench.seeds),
the training-length study (bench.lengths) and the hyperparameter searches with their reruns
(bench.search_reruns), every figure from the tables' reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.report import tables
from pipeline.report.markdown import figure, fmt, pm, table


def seeds_section(studies: list[dict[str, Any]], study: dict[str, Any] | None) -> list[str]:
    """The seed studies: the one made with the runs' own values sets the noise of the tables
    above; the others are listed as the configurations they are."""
    if not studies:
        return []
    if study:
        first = (
            f"[`{study['folder']}/`]({study['folder']}/README.md) is made with the values the "
            "runs above train from: there one method's best top-1 moves by up to "
            f"{study['diff']['noise']:.2f} points between seeds, so a single-seed Δ top-1 in "
            "the tables above smaller than that is noise; the inter-node bytes are the same "
            "at every seed. The other studies are other configurations: their numbers are "
            "their own, not the tables' noise."
        )
    else:
        first = (
            "None of the studies here is made with the values the runs above train from, so "
            "none measures their seed noise."
        )
    return [
        "",
        "## Seeds",
        "",
        "Seed studies (`python -m bench.seeds`) rerun a pair of the matrix at several seeds. "
        + first,
        *seed_pairs(studies),
    ]


def lengths_section(p: dict[str, Any]) -> list[str]:
    """The training-length study (`python -m bench.lengths`): its sentence, its figure and
    AB's row at each length; nothing when there is none made with the runs' model."""
    data = tables.lengths_study(p)
    if not data:
        return []
    rows = [
        [
            s["epochs"],
            s["steps"],
            m,
            len(x["seeds"]),
            pm(x["diff_top1"]),
            f"{x['bytes_vs_ddp']:.3f}",
            f"{x['compression_ratio']:.2f}:1",
        ]
        for s in data["summary"]
        for m, x in s["methods"].items()
        if m != "ddp" and x["diff_top1"]
    ]
    return [
        "",
        "## Over training length",
        "",
        f"Is AB's gap the method or the short training? [`lengths/`](lengths/README.md) trains "
        f"the matrix's {data['shape'][0]} × {data['shape'][1]} runs at several lengths, several "
        f"seeds each: {data['verdict']}",
        "",
        "![AB over training length](lengths/lengths.png)",
        "",
        *table(
            [
                "epochs",
                "steps",
                "method",
                "seeds",
                "Δ best top-1 vs DDP (points)",
                "bytes / DDP's",
                "compression",
            ],
            rows,
        ),
    ]


def seed_pairs(studies: list[dict[str, Any]]) -> list[str]:
    """One line per seed study (tables.seed_studies): its pair's difference in best top-1 at
    each seed, mean ± sd, and how far one method moves over the seeds. A study trained from
    other search values than the committed record's is named apart, not summarised."""
    out, other, earlier = [], [], []
    for s in studies:
        link = f"[`{s['folder']}/`]({s['folder']}/README.md)"
        if not s["same_model"]:
            earlier.append(link)
            continue
        if s["searched"] and not s["same_values"]:
            other.append(link)
            continue
        d = tables.study_difference(s)
        if not d:
            continue
        trained = "with" if s["searched"] else "without"
        also = f" and {', '.join(f'`{x}`' for x in s['extra'])}" if s["extra"] else ""
        out.append(
            f"- {link}, {trained} the search's values{also}: {d['of']} over seeds "
            f"{', '.join(d['per_seed'])} is "
            + ", ".join(f"{v:+.2f}" for v in d["per_seed"].values())
            + f" points (mean ± sd {pm(d)}); one method's best top-1 moves by up to "
            f"{d['noise']:.2f} points"
            + (" (the runs' configuration)." if s["matches"] else " (another configuration).")
        )
    if other:
        out.append(
            f"- Trained from an earlier search result than the committed record (other values, "
            f"another configuration, so not comparable with the tables above): "
            f"{', '.join(other)}."
        )
    if earlier:
        out.append(
            f"- Made with {tables.EARLIER_MODEL}, before the matrix's runs were retrained on "
            f"timm's; named here, not compared with the tables above: {', '.join(earlier)}."
        )
    if not out:
        return []
    return ["", "Each study's pair, best top-1 in percentage points at each seed:", "", *out]


def search_section(
    p: dict[str, Any],
    folders: list[Path],
    results: list[dict[str, Any]],
    pics: list[tuple[str, str]],
) -> list[str]:
    md = [
        "## Hyperparameter search: Propulate and Optuna on the same budget",
        "",
        search_table(p, folders, results),
    ]
    for path, caption in pics:
        md += figure(path, caption)
    return md


def search_table(p: dict[str, Any], folders: list[Path], results: list[dict[str, Any]]) -> str:
    """Each search's best and median error and its wall time, the search the runs above
    trained from, and what a rerun of the search moved."""
    if not folders:
        return "No search ran.\n"
    rows = []
    for f, r in zip(folders, results):
        best = tables.search_best(f) or {}
        wall = r["curve"][-1]["seconds"] if r["curve"] else None
        rows.append(
            [
                r["backend"],
                r["evaluations"],
                fmt(best.get("error")),
                fmt(best.get("median_error")),
                fmt(wall, ".0f"),
            ]
        )
    head = ["backend", "evaluations", "best error (%)", "median error (%)", "wall time (s)"]
    lines = table(head, rows)
    lines += ["", *chosen_backend(p, folders), *rerun_spread(p)]
    return "\n".join(lines) + "\n"


def rerun_spread(p: dict[str, Any]) -> list[str]:
    """What rerunning the search moved (`python -m bench.search_reruns`), beside the seeds."""
    d = tables.reruns()
    if d is None:
        return []
    out = [
        "",
        f"What a rerun of the search moves ([`search-reruns/`](search-reruns/README.md), "
        f"`{d['command']}`): {len(d['rows'])} searches with the same settings, "
        + (
            "the first the one whose record the runs above train from, "
            if tables.same_model(d, p)
            else f"made with {tables.EARLIER_MODEL} (so not the search above), "
        )
        + f"and {' and '.join(d['runs'])} trained from each best (sd: sample standard deviation):",
        "",
        *table(
            ["figure", "mean", "sd", "min", "max"],
            [
                [
                    label,
                    f"{sp['mean']:.3f}",
                    fmt(sp["std"], ".3f"),
                    f"{sp['min']:.3f}",
                    f"{sp['max']:.3f}",
                ]
                for label, sp in d["spread"].items()
            ],
        ),
    ]
    seeds = d.get("seed_spread")
    if seeds:
        out += [
            "",
            f"The same gap over seeds with the committed best ({seeds['of']}, "
            f"`{Path(seeds['study']).name}/`): mean {seeds['mean']:+.2f}, sd {seeds['std']:.2f}.",
        ]
    return out + ["", d["verdict"]]


def chosen_backend(p: dict[str, Any], folders: list[Path]) -> list[str]:
    """Which search's best trained the matrix, and why that one."""
    if not p["search"]["use_best"]:
        return ["The runs above train `train`'s own values (`search.use_best: []`)."]
    backend = p["search"]["backend"]
    bests = {f.name: tables.search_best(f, ("error",)) for f in folders}
    errors = {name: best["error"] for name, best in bests.items() if best is not None}
    lower = [b for b, e in errors.items() if backend in errors and e < errors[backend]]
    out = [
        f"The runs above train from **{backend}**'s best (`search.backend`; its record, "
        f"`results/search/{backend}/best.json`, is committed, so a fresh clone trains the "
        "same values)"
        + (
            ": Propulate is the paper's search, the one this reproduction follows."
            if backend == "propulate"
            else "."
        )
    ]
    if lower:
        text = (
            f"{', '.join(lower)} found a lower error on the same budget "
            f"({', '.join(f'{errors[b]:.2f}%' for b in lower)} against "
            f"{errors[backend]:.2f}%)"
        )
        reruns = tables.reruns()
        if reruns is not None:
            sp = reruns["spread"]["best error (%)"]
            text += (
                f"; {sp['n']} {backend} searches with the same settings found "
                f"{sp['min']:.2f}-{sp['max']:.2f}% (below), so the gap between the backends "
                + ("is larger than" if min(errors[b] for b in lower) < sp["min"] else "is within")
                + " what a rerun moves"
            )
        out.append(
            text + ". Whether that best would also train a better matrix is not measured; "
            "the runs follow `search.backend`."
        )
    return out
