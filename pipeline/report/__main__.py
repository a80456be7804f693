"""`python -m pipeline.report` (the report stage), `python -m pipeline.report --readme`."""

import sys

from pipeline.common import stage
from pipeline.report import main
from pipeline.report.readme import copy_headline

if __name__ == "__main__":
    if sys.argv[1:] == ["--readme"]:
        copy_headline()
        sys.exit(0)
    sys.exit(stage(main))
