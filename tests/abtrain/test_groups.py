import pytest

from abtrain.distributed import groups


def test_node_groups_first_half_train_a():
    assert groups.roles(4, 2) == [([0, 1], "a"), ([2, 3], "b")]
    assert groups.roles(8, 2) == [([0, 1], "a"), ([2, 3], "a"), ([4, 5], "b"), ([6, 7], "b")]


def test_odd_group_count_gives_the_extra_group_to_b():
    assert groups.roles(6, 2) == [([0, 1], "a"), ([2, 3], "b"), ([4, 5], "b")]


def test_individual_and_no_groups():
    assert groups.roles(4, 1) == [([0], "a"), ([1], "a"), ([2], "b"), ([3], "b")]
    assert groups.roles(4, 4, all_train_b=True) == [([0, 1, 2, 3], "b")]


@pytest.mark.parametrize(
    "env,node", [({"GROUP_RANK": "3"}, 3), ({"SLURM_NODEID": "2"}, 2), ({}, 0)]
)
def test_node_id_comes_from_the_launcher(monkeypatch, env, node):
    for var in ("GROUP_RANK", "SLURM_NODEID"):
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert groups.node_id_from_env() == node
