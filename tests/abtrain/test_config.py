import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from abtrain import config
from abtrain.__main__ import main
from abtrain.method import methods
from tests.abtrain.test_data import write_tree
from tests.helpers import PARAMS, ROOT, tiny_config


@pytest.mark.parametrize(
    "override,key",
    [
        ("ab.sigma_cutoff=1.0", "ab.sigma_cutoff"),
        ("ab.sigma_cutoff=0", "ab.sigma_cutoff"),
        ("ab.ab_steps=0", "ab.ab_steps"),
        ("steps=ten", "steps"),
        ("method=sgd", "method"),
        ("ab.sync_mode=mean", "ab.sync_mode"),
        ("optim.betas=[0.9]", "optim.betas"),
        ("model.width=-1", "model.width"),
    ],
)
def test_bad_values_name_the_key(override, key):
    with pytest.raises(config.ConfigError, match=key.replace(".", r"\.")):
        tiny_config(override)


def test_unknown_key_is_named():
    with pytest.raises(config.ConfigError, match="ab.sigma_cut"):
        tiny_config("ab.sigma_cut=0.1")
    raw = config.load(PARAMS).dump()
    raw["ab"]["typo"] = 1
    with pytest.raises(config.ConfigError, match=r"ab\.typo"):
        config.from_dict(raw)


def test_missing_key_is_named(tmp_path):
    raw = config.load(PARAMS).dump()
    del raw["optim"]["lr"]
    with pytest.raises(config.ConfigError, match=r"optim\.lr"):
        config.from_dict(raw)


def test_warmup_longer_than_the_run_is_refused():
    with pytest.raises(config.ConfigError, match="warmup_steps"):
        tiny_config("steps=10", "ab.warmup_steps=10")


def test_only_no_groups_takes_the_authors_split_of_sigma():
    assert not tiny_config("method=ab_nogroups", "ab.split_sigma=false").ab.split_sigma
    with pytest.raises(config.ConfigError, match="ab.split_sigma=false needs every rank"):
        tiny_config("method=ab", "ab.split_sigma=false")


def test_no_groups_in_node_groups_forms_b_groups_of_that_size():
    """The authors' committed VGG16 config: only-b with group_size 4."""
    from abtrain.distributed import groups

    cfg = tiny_config("method=ab_nogroups", "ab.group_size=2")
    assert methods.check_world(cfg, 4, 2) == 2
    assert groups.roles(4, 2, all_train_b=True) == [([0, 1], "b"), ([2, 3], "b")]
    with pytest.raises(config.ConfigError, match="needs ab.sync_mode with_stale or rank0"):
        methods.check_world(
            tiny_config("method=ab_nogroups", "ab.group_size=2", "ab.sync_mode=only_learned"), 4, 2
        )


def test_world_that_cannot_form_the_groups_is_refused():
    cfg = tiny_config("ab.group_size=3")
    with pytest.raises(config.ConfigError, match="group_size=3 does not divide the world size 4"):
        methods.check_world(cfg, 4, 2)
    with pytest.raises(config.ConfigError, match="at least one A group and one B group"):
        methods.check_world(tiny_config(), 2, 2)  # one node of 2 ranks: one group
    assert methods.check_world(tiny_config(), 4, 2) == 2
    assert methods.check_world(tiny_config("method=ab_nogroups"), 2, 2) == 2
    assert methods.check_world(tiny_config("method=ab_individual"), 2, 2) == 1


def test_cli_stops_before_any_process_group(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [1, 2]\n")
    assert main(["check", "--config", str(bad)]) == 2
    assert "bad.yaml" in capsys.readouterr().err
    assert (
        main(
            ["train", "--config", str(PARAMS), "--set", "ab.sigma_cutoff=2", "--out", str(tmp_path)]
        )
        == 2
    )
    assert "ab.sigma_cutoff" in capsys.readouterr().err
    assert main(["check", "--config", str(tmp_path / "none.yaml")]) == 2
    assert not (tmp_path / "summary.json").exists()


# ---------------------------------------------------------------- the CLI as a user runs it
def python_m(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """`python -m abtrain ARGS`, a process of its own (as a user starts it)."""
    return subprocess.run(
        [sys.executable, "-m", "abtrain", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """The same command through `abtrain.__main__.main`, what `python -m abtrain` calls, in
    this process: each new process would import torch and timm again (about 4 s a call on
    two cores). `python_m` is the process a user starts; a test below goes through it."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as stop:  # argparse's usage errors
            code = stop.code if isinstance(stop.code, int) else 1
    return subprocess.CompletedProcess(["abtrain", *args], code, out.getvalue(), err.getvalue())


def sets(*overrides: str) -> list[str]:
    return [a for o in overrides for a in ("--set", o)]


def check_on(world: int, per_node: int, *args: str) -> subprocess.CompletedProcess:
    """`abtrain check` of params.yaml for `world` ranks, `per_node` on each node."""
    where = ["--world-size", str(world), "--ranks-per-node", str(per_node)]
    return cli("check", "--config", "params.yaml", *where, *args)


@pytest.mark.parametrize(
    "override,key",
    [
        ("optim.lr=.inf", "optim.lr"),
        ("optim.lr=.nan", "optim.lr"),
        ("optim.max_grad_norm=.nan", "optim.max_grad_norm"),
        ("optim.max_grad_norm=.inf", "optim.max_grad_norm"),
        ("optim.betas=[0.9, 1.0]", "optim.betas.1"),
        ("optim.betas=[-0.1, 0.999]", "optim.betas.0"),
        ("optim.weight_decay=.inf", "optim.weight_decay"),
    ],
)
def test_cli_check_names_the_key_of_a_non_finite_or_out_of_range_value(override, key):
    run = check_on(4, 2, *sets(override))
    assert run.returncode == 2 and f"{key}:" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize("command", ["check", "train"])
def test_cli_a_malformed_set_value_names_the_override(tmp_path, command):
    out = ["--out", str(tmp_path / "run")] if command == "train" else []
    run = cli(command, "--config", "params.yaml", *sets("model={name: vit"), *out)
    assert run.returncode == 2, run.stderr
    assert "override 'model={name: vit'" in run.stderr and "not valid YAML" in run.stderr
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "run").exists()


def test_cli_check_on_the_committed_params_without_a_world_size():
    run = python_m("check", "--config", "params.yaml")
    assert run.returncode == 0, run.stderr
    assert "valid (ab, 2 ranks)" in run.stdout and "--world-size N" in run.stdout
    assert cli("check", "--config", "params.yaml", *sets("method=ddp")).returncode == 0
    one_node = cli("check", "--config", "params.yaml", "--world-size", "4")
    assert one_node.returncode == 2 and "--ranks-per-node" in one_node.stderr


def test_cli_check_refuses_a_batch_larger_than_the_data(tmp_path):
    synthetic = (
        "data={name: synthetic, features: 8, classes: 2, train_samples: 100, val_samples: 10}"
    )
    ok = check_on(2, 1, *sets(synthetic, "batch_size=50"))
    assert ok.returncode == 0, ok.stderr
    run = check_on(4, 2, *sets(synthetic, "batch_size=32"))
    assert run.returncode == 2 and "batch_size=32" in run.stderr, run.stderr
    assert "global batch of 128" in run.stderr and "100 training samples" in run.stderr

    write_tree(tmp_path / "tree")  # 2 classes x 3 training images
    image = (
        f"data={{name: imagefolder, source: {tmp_path / 'tree'}, sha256: null, "
        f"prepared: {tmp_path / 'p'}, train_per_class: 0, val_per_class: 0, real_labels: null, image_size: 32, "
        "augment: true, workers: 0}"
    )
    assert cli("prepare", "--config", "params.yaml", *sets(image)).returncode == 0
    run = check_on(4, 2, *sets(image, "batch_size=2"))
    assert run.returncode == 2 and "batch_size=2" in run.stderr, run.stderr
    assert "6 training samples" in run.stderr and "meta.json" in run.stderr
    cifar = "data.name=cifar10", "data.source=null", "data.train_per_class=10"
    run = cli("check", "--config", "params.yaml", *sets(*cifar, "batch_size=64"))
    assert run.returncode == 2 and "100 training samples" in run.stderr, run.stderr


def test_a_key_given_twice_in_the_params_file_is_refused_naming_its_lines(tmp_path):
    text = PARAMS.read_text().replace("    lr: 0.002\n", "    lr: 0.002\n    lr: 0.2\n", 1)
    assert text != PARAMS.read_text()
    (tmp_path / "params.yaml").write_text(text)
    run = cli("check", "--config", str(tmp_path / "params.yaml"))
    assert run.returncode == 2
    assert "key 'lr' is given twice in one mapping" in run.stderr and ".yaml:" in run.stderr


def test_an_exponent_without_a_dot_is_the_number_it_means():
    assert tiny_config("optim.lr=1e30").optim.lr == 1e30  # YAML 1.1 alone reads a string
    assert tiny_config("optim.min_lr=1e-6").optim.min_lr == 1e-6


def test_schedule_keys_as_fractions_of_steps_resolve_to_steps_with_the_matrixs_rule():
    """params.yaml's phases are fractions of `steps`: a shorter run keeps its shape, with the
    rounding and floors the matrix and the search use (config.to_steps)."""
    from abtrain import config as c

    at = {n: c.load(PARAMS, [f"steps={n}"]) for n in (400, 60, 7)}
    assert (at[400].ab.warmup_steps, at[400].ab.ab_steps, at[400].optim.lr_warmup_steps) == (
        80, 40, 20)  # fmt: skip
    assert (at[60].ab.warmup_steps, at[60].ab.ab_steps, at[60].ab.rebound_steps) == (12, 6, 2)
    assert at[7].ab.rebound_steps == 1  # a phase rounded to 0 steps keeps one (STEP_FLOORS)
    assert c.load(PARAMS, ["ab.warmup_steps=80.0"]).ab.warmup_steps == 80  # steps as a float
    assert c.load(PARAMS, ["ab.warmup_steps=0.0"]).ab.warmup_steps == 0
    for bad in ("1.5", "-0.2"):
        with pytest.raises(c.ConfigError, match=r"ab\.warmup_steps: .* neither a number of steps"):
            c.load(PARAMS, [f"ab.warmup_steps={bad}"])


def test_check_read_by_a_closed_pipe_ends_quietly():
    """`abtrain check ... | head -n 0`: the reader has gone before the command writes (head
    -n 0 reads nothing and exits at once, while the command still imports torch). It ends
    with 141 (SIGPIPE's code, as `yes | head` does), not a BrokenPipeError traceback. (A
    reader that takes one line first may find the whole output already in the pipe's
    buffer, and the command then ends 0: the test would not say which happened.)"""
    line = f"{sys.executable} -m abtrain check --config params.yaml --layers"
    run = subprocess.run(
        ["bash", "-c", f"{line} | head -n 0; exit ${{PIPESTATUS[0]}}"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.stdout == "", run.stdout
    assert run.returncode == 141 and run.stderr == "", run.stderr


def test_a_hint_to_prepare_names_the_config_file_in_use(tmp_path):
    (tmp_path / "mine.yaml").write_text(PARAMS.read_text())
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "meta.json").write_text("{")  # a prepared folder that is not whole
    config = str(tmp_path / "mine.yaml")
    run = cli("check", "--config", config, *sets(f"data.prepared={tmp_path / 'p'}"))
    assert run.returncode == 2
    assert f"python -m abtrain prepare --config {config} " in run.stderr, run.stderr
