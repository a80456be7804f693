"""`python -m pipeline.miniature` (`bash scripts/paper_mini.sh`)."""

import sys

from pipeline.miniature import main

if __name__ == "__main__":
    sys.exit(main())
