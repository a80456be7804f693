"""The report's verdict: whether AB training pays off here, in a few lines and a table of
the methods (bytes, Δ top-1 over seeds, where each is first to the target accuracy), every
number from the tables' reads. Shared by the report's first section and the README's
opening (readme.headline)."""

from __future__ import annotations

from typing import Any

from pipeline.report import tables
from pipeline.report.markdown import DASH, figure, mean_sd, pm, span, table
from pipeline.report.paper import paper_ratio

NAMES = {
    "ddp": "DDP",
    "ab": "AB",
    "ab_nogroups": "AB without groups",
    "powersgd": "PowerSGD",
    "ab_powersgd": "AB + PowerSGD",
    "localsgd": "local SGD",
    "diloco": "DiLoCo",
}


def method_of(run: str, acc: list[dict[str, Any]], p: dict[str, Any]) -> str | None:
    for r in acc:
        if r["run"] == run:
            return r["method"]
    return p["experiments"]["runs"].get(run, {}).get("method")


def studies_of(
    method: str, studies: list[dict[str, Any]], acc: list[dict[str, Any]], p: dict[str, Any]
) -> list[dict[str, Any]]:
    """The seed studies of `method` against ddp, with no override beyond the seed's, each
    with its difference (tables.study_difference) as `diff`."""
    out = []
    for s in studies:
        d = tables.study_difference(s)
        if (
            d
            and not s["extra"]
            and method_of(d["compared"], acc, p) == method
            and method_of(d["baseline"], acc, p) == "ddp"
        ):
            out.append({**s, "diff": d})
    return out


def matching_study(
    studies: list[dict[str, Any]], acc: list[dict[str, Any]], p: dict[str, Any]
) -> dict[str, Any] | None:
    """The seed study of ab against ddp made with the values the report's runs train from
    (tables.seed_studies: `matches`), if there is one: the report's noise claims are its."""
    return next((s for s in studies_of("ab", studies, acc, p) if s["matches"]), None)


def mbit(x: float) -> str:
    return f"{x / 1000:.3g} Gbit/s" if x >= 1000 else f"{x:.0f} Mbit/s"


def lead_text(shape: dict[str, Any], method: str) -> str:
    """Where on the link-rate axis the time model has `method` first to the target."""
    lo, hi = shape["grid"]
    parts = []
    for x in (x for x in shape["leads"] if x["method"] == method):
        if x["lo"] <= lo and x["hi"] >= hi:
            parts.append(f"at every rate from {mbit(lo)} to {mbit(hi)}")
        elif x["lo"] <= lo:
            parts.append(f"below {mbit(x['hi'])}")
        elif x["hi"] >= hi:
            parts.append(f"above {mbit(x['lo'])}")
        else:
            parts.append(f"from {mbit(x['lo'])} to {mbit(x['hi'])}")
    return " and ".join(parts) if parts else "never"


def race(shape: dict[str, Any] | None, method: str) -> str:
    """The table's cell: where `method` is first, or that the benchmark did not run it."""
    if shape is None:
        return DASH
    return lead_text(shape, method) if method in shape["methods"] else "not benchmarked"


def ties(shapes: list[dict[str, Any]]) -> list[str]:
    """Where the measured first is not the model's: by how much it was ahead, which the
    model's error covers (abtrain.predict.MODEL_ERROR)."""
    from abtrain.predict import MODEL_ERROR

    said = []
    for s in shapes:
        for m in s["measured"]:
            if m["fastest"] == m["model"] or m["model"] not in m["seconds"]:
                continue
            got, want = m["seconds"][m["fastest"]], m["seconds"][m["model"]]
            gap = (want - got) / want
            near = "within" if gap <= MODEL_ERROR else "beyond"
            said.append(
                f"{NAMES.get(m['fastest'], m['fastest'])} was measured first at {m['rate']} on "
                f"{shape_name(s)}, {gap:.1%} ahead, {near} the model's {MODEL_ERROR:.0%} error"
            )
    return said


def shape_name(s: dict[str, Any]) -> str:
    return f"{s['nodes']} × {s['ranks_per_node']}"


def verdict(
    p: dict[str, Any],
    acc: list[dict[str, Any]],
    t1: list[dict[str, Any]],
    paper: dict[str, Any],
    studies: list[dict[str, Any]],
    gb_per_s: bool = False,
) -> list[str]:
    """Whether AB training pays off here, every number from the files: AB's inter-node bytes
    over DDP's (the matrix), its best top-1 against DDP's as mean ± sd over the seed study
    made with the runs' own values (never one of another configuration), which method the
    network benchmark has first to its target accuracy at each link rate, and what is not
    tested. Shared by the report's first section and the README's opening (readme.headline),
    which must reproduce: `gb_per_s` adds this machine's GB/s ratios (they move with time)."""
    ab_t1 = [r for r in t1 if r["method"] == "ab" and r["ratio_to_ddp"] is not None]
    if not ab_t1:
        return []
    own = [r["diff_best"] for r in acc if r["method"] == "ab" and r["diff_best"] is not None]
    study = matching_study(studies, acc, p)
    shapes = tables.first_to_target(p=p)
    main = shapes[0] if shapes else None
    ab_first = any(x["method"] == "ab" for s in shapes for x in s["leads"])
    below = study["diff"]["mean"] < 0 if study else bool(own) and max(own) < 0
    # one short sentence a line: the README's first screen is read, not scrolled
    text = [f"**Verdict: {head_of(ab_first, bool(shapes), below)}**", ""]
    tradeoff = tables.tradeoff_study(p)
    if tradeoff:  # the question a researcher asks first: what a byte budget buys
        text += tradeoff_line(tradeoff["verdict"])
    text += bytes_and_accuracy(ab_t1, study, own)
    text += factorisation(p, acc, t1, studies)
    lengths = tables.lengths_study(p)
    if lengths:  # is the gap the method or the short training?
        text += lengths_line(lengths["verdict"])
    if shapes:
        text += first_to_target(shapes, ab_first)
    text += against_the_paper(paper, ab_t1, gb_per_s)
    how = [
        "Bytes: inter-node bytes per rank as the ledger counts them, over DDP's at the same "
        "scale. Δ: best top-1 minus DDP's in percentage points; ± is the sample sd over the "
        "seeds of a seed study made with the runs' own values, (1 seed) the matrix's run."
    ]
    if shapes:
        how.append(how_first_to_target(p, shapes))
    lines, apart = verdict_table(p, acc, t1, studies, main)
    return ["\n".join(text), "", *lines, "", *[x for note in how + apart for x in (note, "")][:-1]]


def head_of(ab_first: bool, benchmarked: bool, below: bool) -> str:
    """The verdict's one sentence."""
    if ab_first:
        return "on this CPU-sized profile AB training pays off only on some links (below)."
    if benchmarked and below:
        return "on this CPU-sized profile AB training does not pay off."
    if below:
        return "on this CPU-sized profile AB training saves bytes at a cost in accuracy."
    return "on this CPU-sized profile AB training saves bytes at no measured cost in accuracy."


def bytes_and_accuracy(
    ab_t1: list[dict[str, Any]], study: dict[str, Any] | None, own: list[float]
) -> list[str]:
    """AB's bytes over DDP's, and its best top-1 against DDP's (the seed study, else the
    matrix's single seeds)."""
    lines = [
        f"- It sends {span([r['ratio_to_ddp'] for r in ab_t1], '.3f')} of DDP's inter-node "
        f"bytes ({len(ab_t1)} scale{'s' * (len(ab_t1) > 1)}).",
    ]
    if study:
        d = study["diff"]
        lines.append(
            f"- Its best top-1 is {abs(d['mean']):.2f} ± {d['sd']:.2f} points "
            f"{'below' if d['mean'] < 0 else 'above'} DDP's ({d['n']} seeds of {d['of']}: "
            f"{', '.join(f'{v:+.2f}' for v in d['per_seed'].values())}; "
            f"`reports/{study['folder']}/`)."
        )
    elif own:
        lines.append(
            f"- It is {span([-x for x in own], '.2f')} points of best top-1 below DDP's (one "
            "seed per scale: no seed study here is made with the runs' values)."
        )
    return lines


def matched_runs(p: dict[str, Any]) -> dict[str, str]:
    """{AB run: its matched local SGD run}: the matrix's runs of `localsgd` on AB's own
    schedule (`localsgd.schedule=ab`), each paired with the ab run of the same scale."""
    runs = p["experiments"]["runs"]
    out = {}
    for name, r in runs.items():
        if r.get("method") != "localsgd" or "localsgd.schedule=ab" not in (r.get("set") or []):
            continue
        scale = (r["nodes"], r["ranks_per_node"], r["batch"])
        for other, o in runs.items():
            if o.get("method") == "ab" and (o["nodes"], o["ranks_per_node"], o["batch"]) == scale:
                out[other] = name
                break
    return out


def factorisation(
    p: dict[str, Any],
    acc: list[dict[str, Any]],
    t1: list[dict[str, Any]],
    studies: list[dict[str, Any]],
) -> list[str]:
    """What AB's factorisation adds or costs: AB against local SGD on AB's own schedule (the
    same warm-up, phases, rebounds, LR restarts and search values, the full model trained in
    each node), bytes from the matrix, top-1 from a seed study of the pair (else 1 seed)."""
    ratio = {r["run"]: r["ratio_to_ddp"] for r in t1 if r["ratio_to_ddp"] is not None}
    top1 = {r["run"]: r.get("best_top1") for r in acc}
    lines = []
    for ab, local in matched_runs(p).items():
        if ab not in ratio or local not in ratio or None in (top1.get(ab), top1.get(local)):
            continue
        pair = next(
            (
                d
                for st in studies
                if (d := tables.study_difference(st))
                and not st["extra"]
                and (d["baseline"], d["compared"]) == (local, ab)
            ),
            None,
        )
        if pair:
            gap = (
                f"{abs(pair['mean']):.2f} ± {pair['sd']:.2f} points "
                f"{'below' if pair['mean'] < 0 else 'above'} local SGD's ({pair['n']} seeds: "
                f"{', '.join(f'{v:+.2f}' for v in pair['per_seed'].values())}; "
                f"`reports/{pair_folder(studies, pair)}/`)"
            )
        else:
            diff = top1[ab] - top1[local]
            gap = f"{abs(diff):.2f} points {'below' if diff < 0 else 'above'} local SGD's (1 seed)"
        lines += [
            f"- What the factorisation adds, against local SGD on AB's own schedule ({local}: "
            f"the same phases, rebounds, LR restarts and search values; the full model "
            f"trained in each node):",
            f"  - {ab}'s best top-1 is {gap};",
            f"  - it sends {ratio[ab] / ratio[local]:.2f}× local SGD's inter-node bytes.",
        ]
    return lines


def pair_folder(studies: list[dict[str, Any]], pair: dict[str, Any]) -> str:
    """The folder of the seed study whose difference is `pair`."""
    return next(st["folder"] for st in studies if tables.study_difference(st) == pair)


def firsts(s: dict[str, Any]) -> str:
    """Who is first to the target on shape `s`, and where."""
    named = [(NAMES.get(x["method"], x["method"]), lead_text(s, x["method"])) for x in s["leads"]]
    first = f"{named[0][0]} is first {named[0][1]}"
    return ", ".join([first, *(f"{name} {where}" for name, where in named[1:])])


def first_to_target(shapes: list[dict[str, Any]], ab_first: bool) -> list[str]:
    """The network benchmark's lines: whether AB is ever first, and who is where."""
    main = shapes[0]
    against = [s for s in shapes if s.get("ab_ahead_of_ddp_below")]
    ahead = (
        "; against DDP alone, the paper's only baseline, it is first below "
        + ", ".join(f"{mbit(s['ab_ahead_of_ddp_below'])} on {shape_name(s)}" for s in against)
        if against
        else ""
    )
    measured = ties(shapes)
    return [
        f"- It is never first to the target accuracy at any emulated link rate from "
        f"{mbit(main['grid'][0])} to {mbit(main['grid'][1])} (of {len(main['methods'])} "
        f"methods){ahead}."
        if not ab_first
        else "- It is first to the target accuracy on some emulated links only.",
        "- First to the target, the time model's ranking (nodes × ranks per node):",
        *(
            f"  - {shape_name(s)}: {firsts(s)}" + (";" if i < len(shapes) - 1 or measured else ".")
            for i, s in enumerate(shapes)
        ),
        *(f"  - {x}{'.' if i == len(measured) - 1 else ';'}" for i, x in enumerate(measured)),
    ]


def against_the_paper(
    paper: dict[str, Any], ab_t1: list[dict[str, Any]], gb_per_s: bool
) -> list[str]:
    """The paper's claim, what its Table 1 measures, and (`gb_per_s`) this machine's GB/s."""

    def scheme_text(rows: list[Any], scheme: str) -> str:
        return f"{mean_sd(rows)} at constant {scheme} batch"

    paper_at = {
        k: [x[0] for r in paper["table1"]["rows"] if (x := paper_ratio(r, k))]
        for k in ("local", "global")
    }
    here_at = {
        k: [r["rate_ratio_to_ddp"] for r in ab_t1 if r.get("rate_ratio_to_ddp") and r["batch"] == k]
        for k in ("local", "global")
    }
    return [
        "- The paper's reduction of network traffic (\""
        + paper["table2"]["measured_reduction_claim"]
        + '") is measured in GB/s, traffic over wall time, not in bytes.',
        "- Its Table 1 gives AB/baseline "
        + " and ".join(scheme_text(v, k) for k, v in paper_at.items() if v)
        + " (mean ± sd over its rows, 2-32 nodes).",
        (
            "- Here AB's GB/s over DDP's is "
            + " and ".join(scheme_text(v, k) for k, v in here_at.items() if v)
            + "; it moves with each run's time on this machine."
            if gb_per_s and any(here_at.values())
            else "- The report sets this machine's GB/s ratio beside it."
        ),
        "- The paper's accuracy at its scale (ImageNet on GPU clusters) is not tested here.",
    ]


def how_first_to_target(p: dict[str, Any], shapes: list[dict[str, Any]]) -> str:
    """How "first to the target" was measured, and how often the time model agrees."""
    main = shapes[0]
    checked = [m for s in shapes for m in s["measured"]]
    agree = sum(m["fastest"] == m["model"] for m in checked)
    made = (
        f"the values of the matrix's {shape_name(main)} runs, evaluated every 10 steps"
        if main.get("matrix_values")
        else f"{main['steps']} steps of its own schedule, not the matrix's values"
        if main["steps"]
        else "its own values"
    )
    return (
        "First to the target: the emulated-cluster benchmark "
        f"(`bench/results/network-rates.json`; one seed, made with {made}; target "
        f"{main['target_top1']:.2f}% top-1 on {shape_name(main)}), measured at "
        + " and ".join(
            f"{len(s['measured'])} link rate{'s' * (len(s['measured']) > 1)} on {shape_name(s)}"
            for s in shapes
        )
        + f".\nBetween them the time model (`abtrain.predict.timing.ToTarget`, as `abtrain plan` uses "
        f"it) names the measured fastest at {agree} of those {len(checked)}"
        + ("." if main["model"] == p["train"]["model"] else f", made with {tables.EARLIER_MODEL}.")
    )


def verdict_table(
    p: dict[str, Any],
    acc: list[dict[str, Any]],
    t1: list[dict[str, Any]],
    studies: list[dict[str, Any]],
    shape: dict[str, Any] | None,
) -> tuple[list[str], list[str]]:
    """A row per method of the matrix (ab and ddp at least):
    its bytes over DDP's, its Δ best top-1 (the mean ± sd of a seed study made with the
    runs' own values where there is one, else the matrix's single seeds) and where it is
    first to the target; and the note naming the seed studies made with other search values,
    which the table never uses."""
    # every method of the matrix; a matched run (local SGD on AB's schedule) is its pair's
    # line above, not its method's row
    matched = set(matched_runs(p).values())
    acc = [r for r in acc if r["run"] not in matched]
    t1 = [r for r in t1 if r["run"] not in matched]
    shown = {r["method"] for r in acc} | {"ab", "ddp"}
    order = ["ab", "powersgd", "ab_powersgd", "ab_nogroups", "localsgd", "diloco"]
    head = [
        "method",
        "inter-node bytes vs DDP",
        "Δ best top-1 vs DDP (points)",
        f"first to the target{f' ({shape_name(shape)})' if shape else ''}",
    ]
    body, apart = [], []
    for m in [m for m in order if m in shown] + sorted(shown - {*order, "ddp"}) + ["ddp"]:
        rows = [r for r in t1 if r["method"] == m and r["ratio_to_ddp"] is not None]
        own = [r["diff_best"] for r in acc if r["method"] == m and r["diff_best"] is not None]
        mine = studies_of(m, studies, acc, p)
        match = next((s for s in mine if s["matches"]), None)
        if m == "ddp":
            diff = "0 (reference)"
        elif match:
            diff = f"{pm(match['diff'])} ({match['diff']['n']} seeds)"
        elif own:
            diff = f"{span(own, '+.2f', ' to ')} (1 seed" + (
                f" each, {len(own)} scales)" if len(own) > 1 else ")"
            )
        else:
            diff = DASH
        if not match:
            apart += [
                f"{NAMES.get(m, m)} {pm(s['diff'])} over {s['diff']['n']} seeds "
                f"(`reports/{s['folder']}/`"
                + ("" if s["same_model"] else ", the earlier model")
                + ")"
                for s in mine
                if s["searched"] and not (s["same_values"] and s["same_model"])
            ]
        ratio = span([r["ratio_to_ddp"] for r in rows], ".3f") if rows else DASH
        body.append([f"{NAMES.get(m, m)} (`{m}`)", ratio, diff, race(shape, m)])
    notes = []
    if apart:
        notes.append(
            "Seed studies of another configuration (an earlier search record or model than "
            f"the runs', so not used above): {'; '.join(apart)}."
        )
        if any("the earlier model" in x for x in apart):
            notes.append(f"The earlier model: {tables.EARLIER_MODEL_WHAT}.")
    return table(head, body), notes


def verdict_section(
    p: dict[str, Any],
    acc: list[dict[str, Any]],
    t1: list[dict[str, Any]],
    paper: dict[str, Any],
    studies: list[dict[str, Any]],
    glance: tuple[str, str] | None = None,
) -> list[str]:
    body = verdict(p, acc, t1, paper, studies, gb_per_s=True)
    if not body:
        return []
    return [
        "## Verdict: does AB training pay off here?",
        "",
        *body,
        "",
        *(figure(*glance) if glance else []),
    ]


def tradeoff_line(sentence: str) -> list[str]:
    """The trade-off study's sentence (bench.tradeoff.page.verdict) as lines of the verdict:
    "In N-step runs: A; B; C." is a head and a line per budget."""
    lead, _, rest = sentence.partition(": ")
    if not rest:
        return [f"- Accuracy against bytes (`reports/tradeoff/`): {lower_first(sentence)}"]
    clauses = top_level(rest.rstrip("."), "; ")
    return [
        f"- Accuracy against bytes (`reports/tradeoff/`), {lower_first(lead)}:",
        *(f"  - {c}{'.' if i == len(clauses) - 1 else ';'}" for i, c in enumerate(clauses)),
    ]


def lengths_line(sentence: str) -> list[str]:
    """The length study's sentences (bench.lengths.verdict) as lines of the verdict: a head
    and a line per sentence."""
    parts = [x if x.endswith(".") else x + "." for x in sentence.split(". ")]
    if len(parts) == 1:
        return [f"- Over training length (`reports/lengths/`): {lower_first(sentence)}"]
    return ["- Over training length (`reports/lengths/`):", *(f"  - {x}" for x in parts)]


def top_level(text: str, sep: str) -> list[str]:
    """`text` split at each `sep` outside parentheses."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0 and text.startswith(sep, i):
            parts.append(text[start:i])
            start = i + len(sep)
    return [*parts, text[start:]]


def lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]
