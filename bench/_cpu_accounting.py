"""pytest plugin of ``bench/suite_durations.py --cpu``: each test's CPU seconds, the processes it
starts included (simulated hosts, child pytest runs, Ray clusters and their workers).

On a machine others share, a test's wall time says more about their load than about the test;
its CPU time does not. Every pytest process that runs tests (each xdist worker, or the only one)
moves into a cgroup of its own under ``$XLASIM_BENCH_CPU_CGROUP`` (a cgroup v1 ``cpuacct``
directory), which every process it starts afterwards inherits, Ray's daemons included: the
cgroup's usage before and after a test is what the test cost. A cluster kept up between tests
counts to the tests that run while it is up. Each test is one JSON line in
``$XLASIM_BENCH_CPU_OUT.<worker>``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

CGROUP_ENV = "XLASIM_BENCH_CPU_CGROUP"
OUT_ENV = "XLASIM_BENCH_CPU_OUT"


def _own_cgroup() -> Path | None:
    base = os.environ.get(CGROUP_ENV)
    if not base:
        return None
    return Path(base) / os.environ.get("PYTEST_XDIST_WORKER", "main")


def _runs_tests(config: pytest.Config) -> bool:
    # With -n, the controller only schedules: its workers run the tests.
    return bool(os.environ.get("PYTEST_XDIST_WORKER")) or not config.getoption("numprocesses", None)


def pytest_configure(config: pytest.Config) -> None:
    cgroup = _own_cgroup()
    if cgroup is None or not _runs_tests(config):
        return
    cgroup.mkdir(exist_ok=True)
    (cgroup / "cgroup.procs").write_text(str(os.getpid()))


def _usage_s(cgroup: Path) -> float:
    return int((cgroup / "cpuacct.usage").read_text()) / 1e9


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    cgroup = _own_cgroup()
    if cgroup is None or not _runs_tests(item.config):
        yield
        return
    before = _usage_s(cgroup)
    yield
    record = {"nodeid": item.nodeid, "cpu_s": _usage_s(cgroup) - before}
    out = f"{os.environ[OUT_ENV]}.{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
    with open(out, "a") as f:
        f.write(json.dumps(record) + "\n")
