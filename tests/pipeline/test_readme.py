"""The README's figures are the committed report's."""

from pipeline.report import readme as report_readme
from tests.helpers import ROOT


def test_the_readme_opening_is_the_reports_headline():
    """`python -m pipeline.report --readme` copies reports/headline.md (written by the report
    stage) between the README's markers; a README that drifted from the report fails here."""
    readme = (ROOT / "README.md").read_text()
    begin, end = report_readme.MARKS
    assert readme.count(begin) == 1 and readme.count(end) == 1
    block = readme.split(begin, 1)[1].split(end, 1)[0]
    assert block == (ROOT / "reports" / "headline.md").read_text()
    # read as it is shown: a claim a line, none a wall of text (the table's rows aside)
    long = [x for x in block.splitlines() if len(x) > 280 and not x.startswith("|")]
    assert not long, long


def test_the_readme_is_a_front_door():
    """At most 300 lines; the two set-up commands on the first screen (40 lines); a path for
    each kind of user; the rest in docs/, whose index names every page."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300
    first = "\n".join(lines[:40])
    assert "bash scripts/main.sh" in first and "bash scripts/test.sh" in first
    text = "\n".join(lines)
    for path in ("Reproduce the paper", "your own model", "pay off on my network"):
        assert path in text
    index = (ROOT / "docs" / "README.md").read_text()
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert page.name == "README.md" or f"]({page.name}" in index, page.name


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    import re

    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_every_relative_link_of_the_readme_and_docs_resolves():
    """A moved section or renamed page is a broken link here, not a 404 for a reader."""
    import re

    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        text = page.read_text()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
                continue
            if anchor and dest.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", dest.read_text(), flags=re.M)
                if anchor not in {_anchor(h) for h in headings}:
                    broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, broken


def test_the_searches_learning_rates_read_as_a_range_or_as_the_one_they_chose():
    assert report_readme.learning_rates([0.001008, 0.001208]) == (
        "learning rates from 0.00101 to 0.00121"
    )
    assert report_readme.learning_rates([0.001008, 0.0010077]) == "the same learning rate (0.00101)"
