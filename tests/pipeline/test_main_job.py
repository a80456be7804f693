"""The main job: its closing lines (where its time went, from DVC's own output), and the
lock it reproduces from."""

import re
import subprocess
import sys

from pipeline import main_job
from tests.helpers import ROOT

FAKE = """
import time
print("Verifying data sources in stage: 'prepare'")
print("Stage 'prepare' didn't change, skipping")
print("Running stage 'search@propulate':")
time.sleep(0.3)
print("Running stage 'train@ab-2x2':")
time.sleep(0.1)
print("Updating lock file 'dvc.lock'")
"""


def test_it_prints_the_set_up_and_each_stage_it_ran(capsys):
    code = main_job.main(["--setup-seconds", "231", "--command", sys.executable, "-c", FAKE])
    assert code == 0
    out = capsys.readouterr().out.splitlines()
    assert "Running stage 'search@propulate':" in out  # DVC's output passes through
    i = next(i for i, x in enumerate(out) if x.startswith("[main job] where the time went"))
    table = out[i + 1 :]
    assert table[0].split() == ["set-up", "3m51s"]
    assert [x.split()[0] for x in table[1:3]] == ["search@propulate", "train@ab-2x2"]
    assert table[3].strip() == "1 stage up to date (not run)"


def test_its_exit_code_is_dvcs():
    assert main_job.main(["--command", sys.executable, "-c", "raise SystemExit(3)"]) == 3


def test_the_lock_holds_the_code_the_committed_results_came_from():
    """dvc.lock's hash of every code dependency (abtrain/, search/, pipeline/, bench/) is
    the checkout's, as `python scripts/relock.py --check` finds it. One left stale by a
    change to the code makes the main job rerun every stage below it, the searches too,
    whose best configurations differ from run to run: a fresh clone's AB runs then differ
    from the committed ones (seen: abtrain's hash left stale by a change to the launcher)."""
    proc = subprocess.run(
        [sys.executable, "scripts/relock.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    checked = int(re.search(r"(\d+) code dependencies checked", proc.stdout).group(1))
    assert checked > 10  # every stage's code, foreach stages expanded
    assert proc.returncode == 0, f"{proc.stdout}{proc.stderr}\nfix: python scripts/relock.py"
