"""pytest's hooks: the order of the test files, and the check that each test carries the
marks of what it starts (the tiers: pyproject.toml). What the tests share: helpers.py."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests import helpers
from tests.helpers import _words, marks_needed, require_marks, tiny_config

# The test files that take longest on 2 cores, longest first (pytest --durations in CI):
# started first under `-n`, they end before the short ones do. test_slurm.py, which waits
# for the paper miniature's Slurm cluster (tests/slurm_cluster.LOCK), comes later.
LONGEST = (
    "test_paper_mini.py", "test_pipeline.py", "test_faults.py", "test_search.py", "test_train.py",
    "test_tracking_lost.py", "test_tradeoff.py", "test_api.py", "test_batchnorm.py",
    "test_tracking.py", "test_lengths.py", "test_user_loops.py", "test_slurm.py",
    "test_link_cut.py", "test_config.py",
)  # fmt: skip


@pytest.fixture
def tiny():
    return tiny_config


# ---------------------------------------------------------------- the tiers' marks, checked
# The fast tier (scripts/test-fast.sh) leaves out the tests marked multiprocess, cluster,
# browser, pipeline and slow. A test that starts one of these programs without its mark
# would slip into it, so it fails here instead, naming the mark it needs (helpers.py).
_popen_init = subprocess.Popen.__init__


def _checked_popen_init(self, args, *rest, **kwargs):
    if helpers.running is not None:
        require_marks(marks_needed(args), f"`{' '.join(_words(args))[:200]}`")
    _popen_init(self, args, *rest, **kwargs)


def pytest_configure(config):
    subprocess.Popen.__init__ = _checked_popen_init
    _share_the_cores()


def _share_the_cores() -> None:
    """Under pytest-xdist, each worker (and what it starts) gets its share of the cores, as
    the launcher gives each rank its share: two workers of two threads each on 2 cores
    left OpenMP's threads spinning in barriers for a core the other worker held (a
    LAPACK SVD 100 times slower than alone)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        import torch

        from abtrain.commands.localrun import cores_each

        os.environ.setdefault("OMP_NUM_THREADS", str(cores_each(workers)))
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def pytest_collection_modifyitems(config, items):
    """For `-n N --dist loadfile --no-loadscope-reorder` (pytest-xdist; scripts/test.sh),
    which gives each worker whole test files in the order they come (without the flag,
    the files with most tests first): the longest files first, so that no worker is left
    with one at the end while the other waits."""
    first = {name: i for i, name in enumerate(LONGEST)}
    items.sort(key=lambda item: first.get(item.path.name, len(first)))  # stable


def pytest_unconfigure(config):
    subprocess.Popen.__init__ = _popen_init


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    helpers.running = item  # its fixtures too, module-scoped ones included, start under it
    try:
        yield
    finally:
        helpers.running = None
