"""The verdict at the top of the report and of the README: its accuracy difference is the
mean ± sd of the seed study made with the runs' own search values, never of a study made
with other values; which method is first to the target comes from the network benchmark."""

import json
import os

import pytest

from pipeline.report import tables
from pipeline.report.accuracy import ONE_SEED, accuracy_paragraphs
from pipeline.report.studies import lengths_section, seeds_section
from pipeline.report.verdict import lead_text, matching_study, verdict
from pipeline.stage import params
from tests.helpers import ROOT

RECORD = {"optim.lr": 0.0012, "ab.sigma_cutoff": 0.39}
MODEL = {"name": "timm", "arch": "vit_tiny_patch16_224", "kwargs": {}, "init": "default"}
P = {
    "train": {"model": MODEL},
    "search": {"backend": "propulate", "use_best": ["optim.lr", "ab.sigma_cutoff"]},
    "experiments": {
        "runs": {
            "ddp-2x2": {"method": "ddp"},
            "ab-2x2": {"method": "ab"},
            "psgd-2x2": {"method": "powersgd"},
        }
    },
}
PAPER = {
    "table1": {
        "rows": [
            dict(local_baseline=4.0, local_ab=2.0, global_baseline=None, global_ab=None)
            | dict(
                local_baseline_sd=0.1, local_ab_sd=0.1, global_baseline_sd=None, global_ab_sd=None
            ),
            dict(local_baseline=2.0, local_ab=1.2, global_baseline=4.0, global_ab=1.6)
            | dict(
                local_baseline_sd=0.0, local_ab_sd=0.1, global_baseline_sd=0.2, global_ab_sd=0.1
            ),
        ]
    },
    "table2": {"measured_reduction_claim": "about 50% for all use-cases"},
}


def study(folder, compared, per_seed, values, extra=(), model=MODEL):
    """reports/FOLDER/seeds.json as bench.seeds writes it; `values`: the search values it
    trained with (None: without the search's values); `model` None: written before the
    command recorded its model."""
    n = len(per_seed)
    mean = sum(per_seed) / n
    sd = (sum((x - mean) ** 2 for x in per_seed) / (n - 1)) ** 0.5
    best = dict(n=n, mean=30.0, min=29.0, max=31.0, range=2.0, std=1.0)
    data = dict(
        command=f"python -m bench.seeds --out reports/{folder}",
        baseline="ddp-2x2",
        compared=compared,
        seeds=list(range(n)),
        search_best_values=values is not None,
        **({"search_best": values} if values else {}),
        overrides_extra=["seed=S", "tracking.enabled=false", *extra],
        **({"model": model} if model else {}),
        summary=dict(
            methods={"ddp-2x2": {"best_top1": best}, compared: {"best_top1": best}},
            difference=dict(
                of=f"{compared} - ddp-2x2",
                per_seed={str(i): x for i, x in enumerate(per_seed)},
                spread=dict(n=n, mean=mean, min=min(per_seed), max=max(per_seed), std=sd),
            ),
        ),
    )
    path = tables.REPORTS / folder / "seeds.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def network(leads_ab=False, model=MODEL):
    """bench/results/network-rates.json: the model has powersgd first below 100 Mbit/s and
    ddp above, or (leads_ab) ab first between 100 and 1000 Mbit/s."""
    grid = [10.0 * 10 ** (i / 10) for i in range(31)]  # 10 Mbit/s to 10 Gbit/s

    def curve(f):
        return [[x, f(x)] for x in grid] + [[None, f(1e9)]]

    curves = {
        "ddp": curve(lambda x: 10 + 1000 / x),
        "powersgd": curve(lambda x: 19 + 100 / x),
        "ab": curve((lambda x: 15 + 400 / x) if leads_ab else (lambda x: 30 + 500 / x)),
    }
    cross = [
        dict(methods=["ddp", "powersgd"], mbit_per_s=100.0, faster_below="powersgd"),
        dict(methods=["ab", "powersgd"], mbit_per_s=75.0, faster_below="powersgd"),
        dict(methods=["ab", "ddp"], mbit_per_s=120.0, faster_below="ab"),
    ]
    rates = [
        dict(rate="50mbit", fastest="powersgd", predicted_fastest="powersgd"),
        dict(rate="unshaped", fastest="ddp", predicted_fastest="ddp"),
    ]
    shape = dict(nodes=2, ranks_per_node=2, target_top1=29.9, rates=rates, crossovers=cross)
    path = tables.NETWORK_RATES
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(shapes=[{**shape, "model_curves": curves}])))
    made = dict(overrides=["steps=160"], **({"model": model} if model else {}))
    (path.parent / "network-50mbit.json").write_text(json.dumps(made))


ACC = [
    dict(run="ddp-2x2", method="ddp", diff_best=None),
    dict(run="ab-2x2", method="ab", diff_best=-3.2),
    dict(run="psgd-2x2", method="powersgd", diff_best=-1.55),
]
T1 = [
    dict(run="ddp-2x2", method="ddp", batch="local", ratio_to_ddp=1.0, rate_ratio_to_ddp=1.0),
    dict(run="ab-2x2", method="ab", batch="local", ratio_to_ddp=0.398, rate_ratio_to_ddp=0.345),
    dict(
        run="psgd-2x2",
        method="powersgd",
        batch="local",
        ratio_to_ddp=0.098,
        rate_ratio_to_ddp=0.075,
    ),
]


@pytest.fixture
def here(tmp_path, monkeypatch):
    """A working copy with the search record and three ab studies: one made with the
    record's values (mean -2.00, sd 1.00), one with other values (sorted first), one
    without search values; and a powersgd study with other values."""
    monkeypatch.chdir(tmp_path)
    record = tables.SEARCHES / "propulate" / "best.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"params": RECORD}))
    study("seeds-a-earlier", "ab-2x2", [-0.4, -0.5, -0.6], {**RECORD, "optim.lr": 0.001})
    study("seeds-best-ab", "ab-2x2", [-1.0, -2.0, -3.0], RECORD)
    study("seeds", "ab-2x2", [-0.7, -0.8, -0.9], None)
    study("seeds-best-psgd", "psgd-2x2", [-0.2, -0.3, -0.4], {"optim.lr": 0.001})
    study("seeds-best-ab-variant", "ab-2x2", [-5.0, -6.0, -7.0], RECORD, ["ab.ab_steps=9"])
    study("seeds-best-ab-vit", "ab-2x2", [-8.0, -9.0, -10.0], RECORD, model=None)
    network()
    return tmp_path


def test_the_verdict_takes_the_study_made_with_the_runs_values(here):
    studies = tables.seed_studies(P)
    matches = {s["folder"]: s["matches"] for s in studies}
    assert matches == {
        "seeds": False,  # no search values where the runs take them
        "seeds-a-earlier": False,  # other values
        "seeds-best-ab": True,
        "seeds-best-ab-variant": False,  # the same values, and another override
        "seeds-best-ab-vit": False,  # the same values, an earlier model
        "seeds-best-psgd": False,
    }
    md = verdict(P, ACC, T1, PAPER, studies)
    text = md[0]
    assert "does not pay off" in text
    assert "2.00 ± 1.00 points below DDP's" in text
    assert "-1.00, -2.00, -3.00" in text and "`reports/seeds-best-ab/`" in text
    assert "0.398 of DDP's inter-node bytes" in text
    whole = "\n".join(md)
    for other in ("-0.50", "0.80", "-6.00", "seeds-a-earlier", "seeds-best-ab-variant"):
        assert other not in whole, other
    assert "-9.00" not in whole and "earlier model" not in md[0]
    ab = next(line for line in md if line.startswith("| AB (`ab`)"))
    assert "| -2.00 ± 1.00 (3 seeds) |" in ab and ab.endswith("| never |")
    # powersgd's only study is of other values: the table keeps the run's one seed and the
    # study is named apart as an earlier record's
    psgd = next(line for line in md if line.startswith("| PowerSGD"))
    assert "| -1.55 (1 seed) |" in psgd and psgd.endswith("| below 100 Mbit/s |")
    assert "an earlier search record or model" in whole and "-0.30 ± 0.10" in whole
    # the page's noise claims are the matching study's too, not reports/seeds/'s
    study = matching_study(studies, ACC, P)
    notes = accuracy_paragraphs([{**r, "best_top1": 1, "final_top1": 1} for r in ACC], study)
    seed = next(n for n in notes if n.startswith(ONE_SEED))
    assert "`reports/seeds-best-ab/`" in seed and "-2.00 ± 1.00" in seed
    assert "`reports/seeds/`" not in seed
    section = "\n".join(seeds_section(studies, study))
    assert "[`seeds-best-ab/`](seeds-best-ab/README.md) is made with the values" in section
    # the study of the earlier model is named as such, not summarised
    earlier = next(line for line in section.splitlines() if "seeds-best-ab-vit" in line)
    assert tables.EARLIER_MODEL in earlier and "-9.00" not in earlier


def test_a_network_benchmark_of_an_earlier_model_is_named_so(here):
    assert tables.EARLIER_MODEL not in "\n".join(verdict(P, ACC, T1, PAPER, []))
    network(model=None)
    md = verdict(P, ACC, T1, PAPER, [])
    assert f"made with {tables.EARLIER_MODEL}" in "\n".join(md)


def test_without_a_matching_study_the_verdict_says_so(here):
    os.remove(tables.REPORTS / "seeds-best-ab" / "seeds.json")
    studies = tables.seed_studies(P)
    md = verdict(P, ACC, T1, PAPER, studies)
    assert matching_study(studies, ACC, P) is None
    assert "3.20 points of best top-1 below DDP's (one seed per scale" in md[0]
    # no study's mean ± sd stands in for the runs' (the paper's ± of its GB/s ratio stays)
    assert "±" not in md[0].split("The paper's reduction")[0]
    ab = next(line for line in md if line.startswith("| AB (`ab`)"))
    assert "| -3.20 (1 seed) |" in ab


def test_first_to_target_follows_the_model_across_link_rates(here):
    (shape,) = tables.first_to_target()
    assert [(x["method"], x["lo"], x["hi"]) for x in shape["leads"]] == [
        ("powersgd", 10.0, 100.0),
        ("ddp", 100.0, 10000.0),
    ]
    assert shape["unshaped"] == "ddp" and shape["steps"] == 160
    text = verdict(P, ACC, T1, PAPER, tables.seed_studies(P))[0]
    assert "never first to the target accuracy at any emulated link rate" in text
    assert "PowerSGD is first below 100 Mbit/s, DDP above 100 Mbit/s" in text
    # the paper's ratio is of GB/s, as mean ± sd over its rows per batch scheme: the README's
    # verdict names it, without this machine's
    assert "measured in GB/s" in text and "0.345" not in text
    assert "0.550 ± 0.071 (2 runs) at constant local batch" in text
    assert "0.400 (1 run) at constant global batch" in text
    network(leads_ab=True)
    (shape,) = tables.first_to_target()
    assert [x["method"] for x in shape["leads"]] == ["powersgd", "ab", "ddp"]
    assert lead_text(shape, "ab").startswith("from ")
    text = verdict(P, ACC, T1, PAPER, tables.seed_studies(P))[0]
    assert "does not pay off" not in text and "pays off only on some links" in text


def test_the_committed_verdict_is_the_matching_seed_studys(monkeypatch):
    """On the committed files: a study matches only if made with the committed record's
    values, no other override and the matrix's model; the verdict's ± is that study's, or
    (none matching) no study's."""
    monkeypatch.chdir(ROOT)
    p = params()
    done = tables.load_runs(p)
    acc, t1 = tables.accuracy(done), tables.table1(done)
    studies = tables.seed_studies(p)
    record = (tables.search_record(p) or {}).get("params")
    for s in studies:
        same = (
            s["data"].get("search_best") == record and s["data"].get("model") == p["train"]["model"]
        )
        assert s["matches"] == (same and not s["extra"])
    study = matching_study(studies, acc, p)
    text = verdict(p, acc, t1, json.loads(tables.PAPER.read_text()), studies)[0]
    if study:
        d = study["diff"]
        assert f"{-d['mean']:.2f} ± {d['sd']:.2f} points below DDP's" in text
    else:
        assert "one seed per scale" in text
    assert "`reports/seeds/`" not in text
    # the benchmark's columns are made with the runs' own values, and the verdict says so
    whole = "\n".join(verdict(p, acc, t1, json.loads(tables.PAPER.read_text()), studies))
    assert "made with the values of the matrix's 2 × 2 runs" in whole
    # a row for each method of the matrix; one the benchmark did not run is said so; the
    # matched local SGD run is its pair's line, not part of local SGD's row
    rows = {x.split(" | ")[0].split("`")[1]: x for x in whole.splitlines() if x.startswith("| ")
            and "`" in x.split(" | ")[0]}  # fmt: skip
    assert set(rows) == {r["method"] for r in acc}
    (shape, *_) = tables.first_to_target(p=p)
    for m, row in rows.items():
        assert row.endswith("| not benchmarked |") == (m not in shape["methods"]), row
    local = [r["ratio_to_ddp"] for r in t1 if r["method"] == "localsgd" and "-ab-" not in r["run"]]
    assert rows["localsgd"].split(" | ")[1] == f"{local[0]:.3f}"


def test_the_verdict_is_short_sentences_and_names_the_benchmarks_values(here):
    md = verdict(P, ACC, T1, PAPER, tables.seed_studies(P))
    lines = md[0].splitlines()
    assert lines[0].startswith("**Verdict: ") and all(len(x) <= 200 for x in lines), lines
    assert sum(x.startswith("- ") for x in lines) >= 5
    note = next(x for x in md if x.startswith("First to the target"))
    assert "160 steps of its own schedule, not the matrix's values" in note


def test_the_verdict_says_what_the_length_study_found_when_made_with_the_runs_model(here):
    """reports/lengths/lengths.json (bench.lengths): its sentence is one line of the verdict,
    and a study of another model is not."""
    path = tables.REPORTS / "lengths" / "lengths.json"
    path.parent.mkdir(parents=True)
    said = "From 1 to 16 epochs AB's gap to DDP narrows (-3.00 ± 0.50 to -1.00 ± 0.40 points)."
    path.write_text(json.dumps(dict(model=MODEL, verdict=said)))
    text = verdict(P, ACC, T1, PAPER, tables.seed_studies(P))[0]
    line = "- Over training length (`reports/lengths/`): from 1 to 16 epochs AB's gap to DDP"
    assert line + " narrows (-3.00 ± 0.50 to -1.00 ± 0.40 points)." in text.splitlines()
    two = said + " At 16 epochs AB does not compress."  # a line a sentence, under a head
    path.write_text(json.dumps(dict(model=MODEL, verdict=two)))
    lines = verdict(P, ACC, T1, PAPER, tables.seed_studies(P))[0].splitlines()
    at = lines.index("- Over training length (`reports/lengths/`):")
    assert lines[at + 1 : at + 3] == [f"  - {said}", "  - At 16 epochs AB does not compress."]
    path.write_text(json.dumps(dict(model=None, verdict=said)))
    assert "reports/lengths" not in verdict(P, ACC, T1, PAPER, tables.seed_studies(P))[0]


def test_the_trade_off_studys_sentence_leads_the_verdict(here):
    """reports/tradeoff/points.json (bench.tradeoff): what a byte budget buys is the first
    line under the verdict's head; a study of another model is not there."""
    path = tables.REPORTS / "tradeoff" / "points.json"
    path.parent.mkdir(parents=True)
    said = (
        "In 160-step runs: at ≤ 10% of DDP's inter-node bytes the best top-1 is 29.00% (lr "
        "0.001; 5% of the bytes); at ≤ 40% of DDP's inter-node bytes the best top-1 is 30.00%."
    )
    path.write_text(json.dumps(dict(model=MODEL, verdict=said)))
    lines = verdict(P, ACC, T1, PAPER, tables.seed_studies(P))[0].splitlines()
    first = next(i for i, x in enumerate(lines) if x.startswith("- "))
    # a head, then a line per budget (a semicolon inside parentheses splits nothing)
    assert lines[first : first + 3] == [
        "- Accuracy against bytes (`reports/tradeoff/`), in 160-step runs:",
        "  - at ≤ 10% of DDP's inter-node bytes the best top-1 is 29.00% (lr 0.001; 5% of the "
        "bytes);",
        "  - at ≤ 40% of DDP's inter-node bytes the best top-1 is 30.00%.",
    ]
    path.write_text(json.dumps(dict(model=None, verdict=said)))
    assert "reports/tradeoff" not in verdict(P, ACC, T1, PAPER, tables.seed_studies(P))[0]


def test_the_report_has_a_section_over_training_length_from_the_study(here):
    """The study's sentence, its figure and AB's Δ at each length, read from lengths.json."""
    path = tables.REPORTS / "lengths" / "lengths.json"
    path.parent.mkdir(parents=True)
    ab = lambda mean, sd: dict(  # noqa: E731
        seeds=[0, 1], diff_top1=dict(mean=mean, sd=sd), bytes_vs_ddp=0.4, compression_ratio=0.75
    )
    summary = [
        dict(epochs=1, steps=78, methods=dict(ddp=dict(diff_top1=None), ab=ab(-0.2, 0.7))),
        dict(epochs=16, steps=1250, methods=dict(ddp=dict(diff_top1=None), ab=ab(-3.2, None))),
    ]
    data = dict(model=MODEL, verdict="It widens.", shape=[2, 2], summary=summary)
    path.write_text(json.dumps(data))
    md = lengths_section(P)
    assert (
        "## Over training length" in md and "![AB over training length](lengths/lengths.png)" in md
    )
    assert any(x.endswith("seeds each: It widens.") for x in md)
    assert "| 1 | 78 | ab | 2 | -0.20 ± 0.70 | 0.400 | 0.75:1 |" in md
    assert "| 16 | 1250 | ab | 2 | -3.20 | 0.400 | 0.75:1 |" in md
    path.write_text(json.dumps(data | dict(model=None)))
    assert lengths_section(P) == []


def test_the_verdict_says_what_the_factorisation_adds_from_the_matched_runs():
    """AB against local SGD on AB's own schedule: the pair found from the matrix (the ab
    run of the matched run's scale), bytes from table 1, top-1 from the runs (1 seed) when
    no seed study of the pair exists, else the study's mean ± sd and its n."""
    from pipeline.report import verdict

    runs = {
        "ab-2x2": {"method": "ab", "nodes": 2, "ranks_per_node": 2, "batch": "local"},
        "localsgd-ab-2x2": {
            "method": "localsgd", "nodes": 2, "ranks_per_node": 2, "batch": "local",
            "set": ["localsgd.schedule=ab"],
        },
        "localsgd-2x2": {"method": "localsgd", "nodes": 2, "ranks_per_node": 2, "batch": "local"},
    }  # fmt: skip
    p = {"experiments": {"runs": runs}}
    assert verdict.matched_runs(p) == {"ab-2x2": "localsgd-ab-2x2"}
    acc = [{"run": "ab-2x2", "best_top1": 30.0}, {"run": "localsgd-ab-2x2", "best_top1": 32.5}]
    t1 = [{"run": "ab-2x2", "ratio_to_ddp": 0.4}, {"run": "localsgd-ab-2x2", "ratio_to_ddp": 0.5}]
    head, gap, sent = verdict.factorisation(p, acc, t1, [])
    assert head.startswith("- What the factorisation adds") and "(localsgd-ab-2x2:" in head
    assert gap == "  - ab-2x2's best top-1 is 2.50 points below local SGD's (1 seed);"
    assert sent == "  - it sends 0.80× local SGD's inter-node bytes."
    per_seed = {"0": -2.0, "1": -3.0}
    study = {
        "extra": [],
        "folder": "seeds-matched",
        "data": {
            "baseline": "localsgd-ab-2x2",
            "compared": "ab-2x2",
            "summary": {
                "difference": {
                    "of": "best_top1",
                    "per_seed": per_seed,
                    "spread": {"n": 2, "mean": -2.5, "std": 0.71},
                },
                "methods": {},
            },
        },
    }
    _, gap, _ = verdict.factorisation(p, acc, t1, [study])
    assert (
        "2.50 ± 0.71 points below local SGD's (2 seeds: -2.00, -3.00; `reports/seeds-matched/`)"
        in gap
    )
