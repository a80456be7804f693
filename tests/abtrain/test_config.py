import pytest

from abtrain import config
from abtrain.__main__ import main
from tests.conftest import PARAMS, tiny_config


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


def test_world_that_cannot_form_the_groups_is_refused():
    cfg = tiny_config("ab.group_size=3")
    with pytest.raises(config.ConfigError, match="group_size=3 does not divide the world size 4"):
        config.check_world(cfg, 4, 2)
    with pytest.raises(config.ConfigError, match="at least one A group and one B group"):
        config.check_world(tiny_config(), 2, 2)  # one node of 2 ranks: one group
    assert config.check_world(tiny_config(), 4, 2) == 2
    assert config.check_world(tiny_config("method=ab_nogroups"), 2, 2) == 2
    assert config.check_world(tiny_config("method=ab_individual"), 2, 2) == 1


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
