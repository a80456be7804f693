"""`python -m pipeline.report`: the report stage (tables, figures and the verdict in
reports/, from the runs' committed results); `--readme` copies its headline into README.md."""

import sys

from pipeline.report import main
from pipeline.report.readme import copy_headline
from pipeline.stage import parser, stage

if __name__ == "__main__":
    ap = parser("pipeline.report", __doc__)
    ap.add_argument("--readme", action="store_true", help="copy reports/headline.md into README.md")
    if ap.parse_args().readme:
        copy_headline()
        sys.exit(0)
    sys.exit(stage(main))
