"""The README's figures are the committed report's."""

from pipeline.report import readme as report_readme
from tests.conftest import ROOT


def test_the_readme_opening_is_the_reports_headline():
    """`python -m pipeline.report --readme` copies reports/headline.md (written by the report
    stage) between the README's markers; a README that drifted from the report fails here."""
    readme = (ROOT / "README.md").read_text()
    begin, end = report_readme.MARKS
    assert readme.count(begin) == 1 and readme.count(end) == 1
    block = readme.split(begin, 1)[1].split(end, 1)[0]
    assert block == (ROOT / "reports" / "headline.md").read_text()
