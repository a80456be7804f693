"""The main job's closing lines: where its time went, from DVC's own output."""

import sys

from pipeline import main_job

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
