"""What every test of tests/ shares: the Ray settings of the clusters it starts on this machine
(:data:`shared_clusters.RAY_TEST_ENV`), the simulated clusters kept up between tests, and a check
that xdist groups hold."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from shared_clusters import RAY_TEST_ENV, ClusterPool

for _name, _value in RAY_TEST_ENV.items():
    os.environ.setdefault(_name, _value)


@pytest.fixture(scope="session")
def tpu_clusters() -> Iterator[ClusterPool]:
    """The :class:`shared_clusters.ClusterPool` of this pytest process (shut down at its end)."""
    pool = ClusterPool()
    try:
        yield pool
    finally:
        pool.release()


@pytest.fixture
def no_shared_cluster(tpu_clusters: ClusterPool) -> None:
    """For a test that starts Ray itself (or a cluster beside this process): the kept cluster
    is shut down first."""
    tpu_clusters.release()


RAY_MODULES = (
    "test_ray_cluster.py",
    "test_ray_multi_node.py",
    "test_seamless.py",  # v6e-4, then v4-16
    "test_ray_faults.py",  # v4-16
    "test_backend_ray_multi_host.py",  # v4-16, then v6e-16
    "test_torch_tpu_ray_train.py",  # v6e-16, then v6e-8
    "test_backend_ray_single_host.py",  # v6e-8
    "test_backend_ray_multislice.py",  # 2 x v4-8
)
"""The modules that start Ray clusters, in the order they run (after every other module):
tests on the same slice one after the other, so a kept cluster serves them all."""


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A stable sort: every module's tests stay together and in their order.
    rank = {name: i for i, name in enumerate(RAY_MODULES, 1)}
    items.sort(key=lambda item: rank.get(item.path.name, 0))
    _check_xdist_groups(config, items)


_GROUP_LOST = pytest.StashKey[str]()


def _check_xdist_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    # pytest-xdist's --dist loadgroup puts a test's group into its node id on the worker
    # ("...::test@ray") and the controller schedules by that suffix; where the two disagree
    # (pytest 9.2 keeps node ids in a form that pytest-xdist 3.8 does not write to), the groups
    # are silently ignored, Ray tests run on both workers at once and a module's cluster starts
    # on each. Such a run fails every grouped test at once, saying why (an error raised here
    # would reach the user only as an xdist internal error).
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        if item.get_closest_marker("xdist_group") is not None and "@" not in item.nodeid:
            item.stash[_GROUP_LOST] = (
                "--dist loadgroup did not keep this test's xdist_group: this pytest-xdist "
                f"does not support pytest {pytest.__version__} (see the pytest pin in "
                "pyproject.toml)"
            )


def pytest_runtest_setup(item: pytest.Item) -> None:
    lost = item.stash.get(_GROUP_LOST, None)
    if lost:
        pytest.fail(lost, pytrace=False)
