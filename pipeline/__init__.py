"""The reproduction pipeline's stages: thin scripts over abtrain and search, run by DVC."""

import os
import signal
import sys


def _stopped_early(_signum: int, _frame: object) -> None:
    print(
        "[pipeline] stopped (Ctrl-C) as the stage started; nothing of it was recorded",
        file=sys.stderr,
    )
    os._exit(130)


# A DVC stage, `python -m pipeline.<stage>` (runpy imports this package with argv[0] still
# "-m"): a Ctrl-C while it imports torch ends it in one line, not a traceback of the import.
# Its command line (pipeline.stage.parser) puts Python's own handler back before the stage
# does anything.
if sys.argv[:1] == ["-m"] and os.environ.get("DVC_STAGE"):
    signal.signal(signal.SIGINT, _stopped_early)
