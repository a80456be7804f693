"""Stage `report`: reports/ from the runs' results, their learning curves and the searches,
beside the paper's published values. Generated; never edit reports/ by hand. Missing runs
leave a gap (—) in the tables, not a crash.

Reads results/NAME.json (each run's summary and its place in the matrix) and plots/NAME.json
(its validation curve); writes reports/README.md, the tables as CSV, reports/curves.json
(every run's curve in one file, for `dvc plots show`), reports/metrics/NAME.json (DVC
metrics: each run's inter-node bytes per step against its ddp run's; one file per run, so
`dvc metrics show` adds one column, not one per run) and the figures.

`python -m pipeline.report` runs `main()`; `--readme` copies reports/headline.md into the
README (readme.copy_headline). The parts: tables (every file read, the rows computed),
figures (matplotlib, and the captions of the DVC plots `pipeline.plots` renders), page (the
Markdown page assembled, its opening and terms), verdict, accuracy, paper (traffic and
compression beside the paper's) and studies (seeds, lengths, searches): the page's sections;
notes (the notes under the tables), markdown (the formatting and the one table builder
they share), readme (the README's opening).
"""

from __future__ import annotations

from abtrain.files import atomic_write_text, write_record
from pipeline.matrix import runs

# as modules: `from pipeline.report.figures import figures` here would hide the module
from pipeline.report import figures, page, readme, tables
from pipeline.report.tables import REPORTS
from pipeline.stage import params


def main() -> int:
    p = params()
    print(f"[pipeline] report: tables and figures of the {len(runs(p))} runs of the matrix")
    REPORTS.mkdir(exist_ok=True)
    done = tables.load_runs(p)
    missing = [n for n in runs(p) if n not in done]
    acc, t1, t2 = tables.accuracy(done), tables.table1(done), tables.table2(done, p)
    tables.write_csv(REPORTS / "table1_traffic.csv", t1)
    tables.write_csv(REPORTS / "table2_compression.csv", t2)
    write_record(REPORTS / "runs.json", done)
    ratios = tables.vs_ddp(done)
    tables.write_metrics(ratios)
    headline = tables.headline_metrics(done, ratios)
    write_record(REPORTS / "headline.json", headline, end="\n")
    write_record(REPORTS / "curves.json", tables.curves(done))
    paper = tables.paper_reference()
    studies = tables.seed_studies(p)
    glance = figures.verdict_figure(done, studies) if done else None
    pics = figures.figures(done, p, studies) if done else []
    pics += figures.curve_figures()  # from reports/curves.json, written above
    folders = tables.search_folders()
    searched, search_pics = figures.search_comparison(folders) if folders else ([], [])
    search = (folders, searched, search_pics)
    md = page.assemble(page.PageInputs(p, paper, done, missing, acc, t1, t2, pics, search, glance))
    atomic_write_text(REPORTS / "README.md", md)
    atomic_write_text(readme.HEADLINE, readme.headline(p, acc, t1))
    print(f"[pipeline] report: {len(done)} runs, {len(missing)} missing -> {REPORTS / 'README.md'}")
    return 0
