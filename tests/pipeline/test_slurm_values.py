"""SLURM values as a user's params.yaml can hold them: a newline or another control
character in a #SBATCH value, a command where a count belongs. Each is refused, naming the
key, before any batch script is written."""

from pathlib import Path

import pytest
import yaml

from pipeline import slurm
from pipeline.matrix import MatrixRun

# as YAML reads them from a params.yaml: "\n" in double quotes is a real newline
SETTINGS = yaml.safe_load(
    """
partition: gpu
account: null
time: "00:10:00"
gpus_per_node: 0
cpus_per_task: 2
stop_before_s: 60
search_nodes: 1
setup: ""
env: {}
"""
)
ARGS = ["train", "--config", "params.yaml", "--out", "runs/x"]


@pytest.mark.parametrize(
    "key, text",
    [
        ("partition", '"gpu\\n#SBATCH --wrap=touch /tmp/owned\\necho owned"'),
        ("account", '"proj\\recho owned"'),
        ("time", '"00:10:00\\t"'),
    ],
)
def test_a_control_character_in_a_sbatch_value_is_refused_naming_the_key(tmp_path, key, text):
    bad = {**SETTINGS, key: yaml.safe_load(text)}
    with pytest.raises(ValueError, match=rf"experiments\.slurm\.{key}: .* control character"):
        slurm.train_script(bad, 2, 1, ARGS, tmp_path, "ab-2x1")
    p = {"experiments": {"slurm": bad}, "search": {"ranks": 2}}
    run = MatrixRun("ab-2x1", "ab", 2, 1, "local")
    with pytest.raises(SystemExit, match=rf"error: experiments\.slurm\.{key}"):
        slurm.run_slurm(p, run, ARGS, tmp_path / "run")
    with pytest.raises(SystemExit, match=rf"error: experiments\.slurm\.{key}"):
        slurm.run_search(p, ["--resume"], tmp_path / "search")
    assert not list(Path(tmp_path).rglob("job.sbatch"))  # nothing written, nothing submitted


def test_a_run_name_with_a_newline_is_refused():
    with pytest.raises(ValueError, match="the run name: .* control character"):
        slurm.train_script(SETTINGS, 2, 1, ARGS, Path("/tmp/x"), "ab\n#SBATCH --exclusive")


@pytest.mark.parametrize("value", ["4; touch /tmp/owned", "4.5", True, "-1"])
def test_a_count_that_is_not_a_whole_number_is_refused_naming_the_key(tmp_path, value):
    bad = {**SETTINGS, "cpus_per_task": value}
    with pytest.raises(ValueError, match=r"experiments\.slurm\.cpus_per_task: .* whole number"):
        slurm.train_script(bad, 2, 1, ARGS, tmp_path, "ab-2x1")


def test_good_values_make_one_directive_a_line():
    text = slurm.train_script({**SETTINGS, "cpus_per_task": "4"}, 2, 1, ARGS, Path("/r"), "ab")
    directives = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --partition=gpu" in directives
    assert "#SBATCH --cpus-per-task=4" in directives


def test_a_bad_value_is_refused_before_any_job_is_queued(tmp_path, capsys):
    """What every rank would refuse (here AB's groups on a world of one node) is said once,
    by the stage, without sbatch: no job waits in a queue to fail."""
    from tests.helpers import PARAMS, TINY

    out = tmp_path / "run"
    args = ["train", "--config", str(PARAMS), "--out", str(out)]
    for o in [*TINY, "method=ab"]:
        args += ["--set", o]
    run = MatrixRun("one-node", "ab", nodes=1, ranks_per_node=2, batch="local")
    assert slurm.run_slurm({"experiments": {"slurm": SETTINGS}}, run, args, out) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "gives 1 group on 2 ranks" in err[0], err
    assert not out.exists()  # no batch script, no folder
