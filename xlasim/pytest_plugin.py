"""pytest plugin: run one test function on the simulator, real torch_xla on CPU and a real TPU.

Loaded through the ``pytest11`` entry point (installing xlasim is enough).  See
``docs/testing.md`` for the user guide; the short version:

* ``xla_target`` is a parametrized fixture.  A test that asks for it runs once per target:
  ``sim`` (the simulator, mark ``cpu_sim``), ``xla_cpu`` (real torch_xla with
  ``PJRT_DEVICE=CPU``, mark ``xla_cpu``) and ``tpu`` (a real TPU, mark ``tpu``).  A target
  that cannot run here is *skipped with its reason*; it never passes without running.
* ``torch_tpu_target`` is the same for TorchTPU's ``tpu`` device: ``sim`` (the simulated
  TorchTPU, in-process, torch >= 2.11) and ``torch_tpu`` (real TorchTPU on a TPU VM, in a
  subprocess, mark ``torch_tpu``); the test gets TorchTPU loaded.
* Real torch_xla keeps SPMD mode and its runtime caches process-wide, so every real-target
  test runs in a fresh ``python -m pytest <nodeid>`` subprocess; the parent pytest process
  never imports real torch_xla.  Sim-target tests run in-process inside
  ``xlasim.simulate(...)`` with a fresh simulated runtime per test, unless the test carries
  the ``xlasim_shared`` mark.
* ``--topology`` / ``--accelerator`` (or the ``topology(...)`` mark) choose the slice.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tpu_backend import machine
from tpu_backend.machine import (
    count_tpu_chips,
    real_torch_tpu_unavailable,
    real_torch_xla_unavailable,
    torch_tpu_torch_unsupported,
)
from tpu_backend.topology import SliceSpec, check_num_slices, parse_slice

__all__ = [
    "REAL_TARGETS",
    "TARGETS",
    "XlaTarget",
    "count_tpu_chips",
    "torch_tpu_unavailable",
    "real_torch_xla_unavailable",
    "tpu_unavailable",
    "xla_cpu_unavailable",
]

TARGETS = ("sim", "xla_cpu", "tpu", "torch_tpu")
REAL_TARGETS = frozenset({"xla_cpu", "tpu", "torch_tpu"})
_TARGET_MARKS = {"sim": "cpu_sim", "xla_cpu": "xla_cpu", "tpu": "tpu", "torch_tpu": "torch_tpu"}
# The targets of each fixture: torch_xla's, and TorchTPU's (its `tpu` device).
_FIXTURE_TARGETS = {
    "xla_target": ("sim", "xla_cpu", "tpu"),
    "torch_tpu_target": ("sim", "torch_tpu"),
}
DEFAULT_TOPOLOGY = "2x2"
DEFAULT_TIMEOUT_S = 300.0

_XLASIM_DIR = Path(__file__).resolve().parent
# The child must not inherit the simulator, a forced SPMD mode or the parent's extra options.
_CHILD_ENV_DROP_PREFIXES = ("XLASIM_",)
_CHILD_ENV_DROP = frozenset({"XLA_USE_SPMD", "PYTEST_ADDOPTS", "PJRT_DEVICE", "CPU_NUM_DEVICES"})
_OUTPUT_LIMIT = 60_000

_child_target_key = pytest.StashKey[str | None]()
_targets_key = pytest.StashKey[tuple[str, ...]]()


@dataclass(frozen=True)
class XlaTarget:
    """What a test may know about the target it runs on."""

    name: str
    """'sim', 'xla_cpu', 'tpu' or 'torch_tpu'."""
    spec: SliceSpec
    host_index: int = 0
    num_slices: int = 1
    """Slices of ``spec`` joined over DCN (``--num-slices``, the topology mark's)."""

    @property
    def is_real(self) -> bool:
        return self.name in REAL_TARGETS

    @property
    def device_type(self) -> str:
        """What ``torch_xla.runtime.device_type()`` returns on this target."""
        return "CPU" if self.name == "xla_cpu" else "TPU"

    @property
    def num_devices(self) -> int:
        return self.spec.num_devices * self.num_slices

    @property
    def num_hosts(self) -> int:
        return self.spec.num_hosts * self.num_slices

    @property
    def devices_per_host(self) -> int:
        return self.spec.devices_per_host

    def __str__(self) -> str:
        slices = f"{self.num_slices} x " if self.num_slices > 1 else ""
        return f"{self.name} ({slices}{self.spec.pod_type}, topology {self.spec.topology})"


# ---------------------------------------------------------------------------------------------
# Target availability (never imports torch_xla)


def xla_cpu_unavailable(spec: SliceSpec) -> str | None:
    if spec.num_hosts > 1:
        return (
            f"it runs one process on one host, but topology {spec.topology} "
            f"({spec.accelerator}, {spec.pod_type}) has {spec.num_hosts} hosts"
        )
    return real_torch_xla_unavailable()


def tpu_unavailable(spec: SliceSpec) -> str | None:
    return _tpu_vm_unavailable(spec) or real_torch_xla_unavailable()


def _tpu_vm_unavailable(spec: SliceSpec) -> str | None:
    """Why this host is not a TPU VM of one host of ``spec``, or None where it is."""
    chips = count_tpu_chips()
    if chips == 0:
        return (
            f"no TPU chips on this host (no PCI device of vendor {machine.GOOGLE_PCI_VENDOR_ID} "
            f"under {machine.PCI_DEVICES_ROOT})"
        )
    if spec.num_hosts > 1:
        return (
            f"topology {spec.topology} ({spec.pod_type}) has {spec.num_hosts} hosts; the tpu "
            "target runs on one TPU VM only"
        )
    if chips != spec.chips_per_host:
        return (
            f"this host has {chips} TPU chips but {spec.pod_type} (topology {spec.topology}) "
            f"has {spec.chips_per_host}; pass --topology/--accelerator matching this TPU VM"
        )
    return None


def torch_tpu_unavailable(spec: SliceSpec) -> str | None:
    """Why real TorchTPU cannot run a test of ``spec`` here: as the tpu target, chips of one
    host of the slice, and the real ``torch_tpu`` with a torch it supports."""
    return _tpu_vm_unavailable(spec) or real_torch_tpu_unavailable()


def _unavailable(target: XlaTarget) -> str | None:
    if target.is_real and target.num_slices > 1:
        return f"it runs on one slice, and this test asks for {target.num_slices} slices"
    if target.name == "xla_cpu":
        return xla_cpu_unavailable(target.spec)
    if target.name == "tpu":
        return tpu_unavailable(target.spec)
    if target.name == "torch_tpu":
        return torch_tpu_unavailable(target.spec)
    return None


# ---------------------------------------------------------------------------------------------
# Options, marks, parametrization


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("xlasim", "torch_xla targets (simulator, real CPU, real TPU)")
    group.addoption(
        "--topology",
        dest="xla_topology",
        default=DEFAULT_TOPOLOGY,
        help=f"TPU topology of the slice, e.g. 2x2 or 2x2x2 (default {DEFAULT_TOPOLOGY}); "
        "the topology(...) mark overrides it per test",
    )
    group.addoption(
        "--accelerator",
        dest="xla_accelerator",
        default=None,
        help="TPU generation: v2, v3, v4, v5litepod (v5e), v5p, v6e, v7x (default: v6e)",
    )
    group.addoption(
        "--num-slices",
        dest="xla_num_slices",
        default="1",
        help="slices of the topology joined over DCN, a multislice job (default 1; the sim "
        "target only); the topology(..., num_slices=N) mark overrides it per test",
    )
    group.addoption(
        "--xla-targets",
        dest="xla_targets",
        default=",".join(TARGETS),
        help="comma-separated targets the xla_target fixture runs on "
        f"(default {','.join(TARGETS)})",
    )
    group.addoption(
        "--xla-timeout",
        dest="xla_timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"seconds one real-target test subprocess may run (default {DEFAULT_TIMEOUT_S:g})",
    )
    group.addoption(
        "--xlasim-compiler",
        dest="xlasim_compiler",
        default=None,
        help="also compile every simulated graph with a real compiler: libtpu (needs the "
        "tpu-compiler extra) or none; sets XLASIM_COMPILER for the session's simulations",
    )
    # Internal: set on the child pytest that runs one real-target test.
    group.addoption("--xlasim-child", dest="xlasim_child", default=None, help=argparse.SUPPRESS)
    group.addoption(
        "--xlasim-child-report", dest="xlasim_child_report", default=None, help=argparse.SUPPRESS
    )


def _parse_targets(value: str) -> tuple[str, ...]:
    names = [n.strip() for n in value.split(",") if n.strip()]
    bad = [n for n in names if n not in TARGETS]
    if bad or not names:
        raise pytest.UsageError(
            f"--xla-targets {value!r}: unknown target(s) {bad or '(none given)'}; "
            f"valid targets are {', '.join(TARGETS)} (comma-separated)"
        )
    return tuple(t for t in TARGETS if t in names)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cpu_sim: runs on the xlasim simulator (xla_target 'sim')")
    config.addinivalue_line("markers", "xla_cpu: runs on real torch_xla with PJRT_DEVICE=CPU")
    config.addinivalue_line("markers", "tpu: runs on a real TPU")
    config.addinivalue_line("markers", "torch_tpu: runs on real TorchTPU (torch_tpu) on a TPU VM")
    config.addinivalue_line(
        "markers",
        "topology(topology, accelerator=None): the slice this test runs on "
        "(overrides --topology/--accelerator); num_slices=N: N of them joined over DCN "
        "(overrides --num-slices)",
    )
    config.addinivalue_line(
        "markers",
        "mat_mul_precision(level): torch_xla's f32 matmul precision ('default', 'high' or "
        "'highest') while this test runs, on every target; a test comparing with eager CPU "
        "asks for 'highest', as pytorch/xla's own TPU tests do",
    )
    config.addinivalue_line(
        "markers",
        "xlasim_shared: sim-target tests of one module carrying this mark share one simulated "
        "runtime instead of a fresh one each",
    )
    try:
        parse_slice(config.getoption("xla_topology"), config.getoption("xla_accelerator"))
    except (ValueError, KeyError) as exc:
        raise pytest.UsageError(f"--topology/--accelerator: {exc}") from exc
    _option_num_slices(config)
    config.stash[_targets_key] = _parse_targets(config.getoption("xla_targets"))
    _configure_compiler(config)
    child = config.getoption("xlasim_child")
    if child is not None and child not in REAL_TARGETS:
        raise pytest.UsageError(f"--xlasim-child {child!r}: expected one of {sorted(REAL_TARGETS)}")
    config.stash[_child_target_key] = child
    report_path = config.getoption("xlasim_child_report")
    if child is not None and report_path:
        config.pluginmanager.register(_ChildReporter(Path(report_path)), "xlasim-child-reporter")


_COMPILER_ENV = "XLASIM_COMPILER"
_saved_compiler_key = pytest.StashKey[str | None]()


def _configure_compiler(config: pytest.Config) -> None:
    name = config.getoption("xlasim_compiler")
    if name is None:
        return
    # Deferred: the real-target child loads this file without the xlasim package.
    from xlasim.runtime.settings import resolve_compiler

    try:
        resolve_compiler(name)
    except (ValueError, ImportError) as exc:
        raise pytest.UsageError(f"--xlasim-compiler: {exc}") from exc
    config.stash[_saved_compiler_key] = os.environ.get(_COMPILER_ENV)
    os.environ[_COMPILER_ENV] = name


def pytest_unconfigure(config: pytest.Config) -> None:
    if _saved_compiler_key not in config.stash:
        return
    saved = config.stash[_saved_compiler_key]
    if saved is None:
        os.environ.pop(_COMPILER_ENV, None)
    else:
        os.environ[_COMPILER_ENV] = saved


def pytest_report_header(config: pytest.Config) -> str | None:
    spec = parse_slice(config.getoption("xla_topology"), config.getoption("xla_accelerator"))
    slices = _option_num_slices(config)
    hosts = spec.num_hosts * slices
    if hosts == 1:
        return None
    what = f"{slices} slices of {spec.pod_type} have" if slices > 1 else f"{spec.pod_type} has"
    return (
        f"xlasim: {what} {hosts} hosts; each sim-target test is one "
        "process standing for all of them (host 0; the others enter the same data)"
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    for fixture, targets in _FIXTURE_TARGETS.items():
        if fixture not in metafunc.fixturenames:
            continue
        params = [
            pytest.param(name, marks=getattr(pytest.mark, _TARGET_MARKS[name]), id=name)
            for name in metafunc.config.stash[_targets_key]
            if name in targets
        ]
        metafunc.parametrize(fixture, params, indirect=True)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Before `-m` deselects: a test on the xlasim_sim fixture is a simulator test.
    for item in items:
        if "xlasim_sim" in getattr(item, "fixturenames", ()) and not item.get_closest_marker(
            "cpu_sim"
        ):
            item.add_marker(pytest.mark.cpu_sim)


def _runs_simulated(item: pytest.Item) -> bool:
    if "xlasim_sim" in getattr(item, "fixturenames", ()):
        return True
    callspec = getattr(item, "callspec", None)
    return callspec is not None and "sim" in (
        callspec.params.get(fixture) for fixture in _FIXTURE_TARGETS
    )


def pytest_collection_finish(session: pytest.Session) -> None:
    # Autograd fixes its set of devices at a process's first backward pass: an eager CPU test
    # that trains before this process's first simulator test would make that test and every
    # later one fail, depending on test order (and xdist's distribution). Registering the
    # simulated device up front makes the order irrelevant -- also where real torch_xla is
    # installed (its targets run in child processes; and an in-process import of it after this
    # registration still gets its own device, checked on torch_xla 2.9), unless this process
    # has imported it already.
    imported = sys.modules.get("torch_xla")
    path = getattr(imported, "__file__", None)
    real = imported is not None and not (path and _in_simulator(path))
    if session.config.option.collectonly or real:
        return
    if any(map(_runs_simulated, session.items)):
        import xlasim  # deferred: the real-target child loads this file without the package

        xlasim.register_xla_device()


def _option_num_slices(config: pytest.Config) -> int:
    raw = config.getoption("xla_num_slices")
    try:
        return check_num_slices(int(raw))
    except ValueError:
        raise pytest.UsageError(
            f"--num-slices {raw!r} is not valid: expected a whole number >= 1"
        ) from None


def _num_slices_for(node: pytest.Item, config: pytest.Config) -> int:
    marker = node.get_closest_marker("topology")
    if marker is not None:
        # A mark names the whole target: one slice unless it says more.
        return check_num_slices(marker.kwargs.get("num_slices", 1))
    return _option_num_slices(config)


def _target(name: str, request: pytest.FixtureRequest) -> XlaTarget:
    node, config = request.node, request.config
    return XlaTarget(name, _slice_for(node, config), num_slices=_num_slices_for(node, config))


def _slice_for(node: pytest.Item, config: pytest.Config) -> SliceSpec:
    marker = node.get_closest_marker("topology")
    if marker is None:
        return parse_slice(config.getoption("xla_topology"), config.getoption("xla_accelerator"))
    args, kwargs = list(marker.args), dict(marker.kwargs)
    unknown = set(kwargs) - {"topology", "accelerator", "num_slices"}
    if unknown or len(args) > 2 or (not args and "topology" not in kwargs):
        raise TypeError(
            f"@pytest.mark.topology{tuple(args)!r} {kwargs!r}: expected "
            "topology(topology: str, accelerator: str | None = None) and an optional "
            "num_slices: int keyword, e.g. "
            "@pytest.mark.topology('2x2x2', accelerator='v4')"
        )
    topology = args[0] if args else kwargs["topology"]
    accelerator = args[1] if len(args) > 1 else kwargs.get("accelerator")
    return parse_slice(topology, accelerator)


# ---------------------------------------------------------------------------------------------
# Simulator contexts


def _in_simulator(path: str) -> bool:
    """Whether a module file is one of the simulator's (its ``torch_xla`` included)."""
    return _XLASIM_DIR in Path(path).resolve().parents


def _check_simulated_torch_xla(target: XlaTarget) -> None:
    module = sys.modules.get("torch_xla")
    path = getattr(module, "__file__", None)
    if path and not _in_simulator(path):
        raise RuntimeError(
            f"target {target}: the torch_xla imported by this test is {path}, not the simulator"
        )


@contextlib.contextmanager
def _simulated(target: XlaTarget) -> Iterator[None]:
    import xlasim  # deferred: the real-target child loads this file without the xlasim package

    # A test is one process: on a multi-host slice it stands for every host.
    with xlasim.simulate(
        target.spec.topology,
        target.spec.accelerator,
        host_index=target.host_index,
        single_process=target.num_hosts > 1,
        num_slices=target.num_slices,
    ):
        yield
        _check_simulated_torch_xla(target)


class _SharedSimulation:
    """One simulate() context left open across the ``xlasim_shared`` tests of a module."""

    def __init__(self) -> None:
        self._stack: contextlib.ExitStack | None = None
        self._key: tuple[str, str, int, int] | None = None
        self.environ_before: dict[str, str] = {}

    def enter(self, target: XlaTarget) -> None:
        key = (target.spec.topology, target.spec.accelerator, target.host_index, target.num_slices)
        if key == self._key:
            return
        self.close()
        self.environ_before = dict(os.environ)
        stack = contextlib.ExitStack()
        stack.enter_context(_simulated(target))
        stack.callback(_OPEN_SHARED.remove, self)
        _OPEN_SHARED.append(self)
        self._stack, self._key = stack, key

    def close(self) -> None:
        stack, self._stack, self._key = self._stack, None, None
        if stack is not None:
            stack.close()


# Shared simulations open right now (at most one per module being run, in practice one).
_OPEN_SHARED: list[_SharedSimulation] = []


@contextlib.contextmanager
def _environ(values: dict[str, str] | None) -> Iterator[None]:
    if values is None:
        yield
        return
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(values)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="module")
def _xlasim_shared_simulation() -> Iterator[_SharedSimulation]:
    shared = _SharedSimulation()
    try:
        yield shared
    finally:
        shared.close()


# xlasim.runtime.settings's PRECISIONS and MAT_MUL_PRECISION_ENV, restated: the real-target child
# loads this file without the xlasim package.
_PRECISIONS = ("default", "high", "highest")
_PRECISION_ENV = "XLASIM_MAT_MUL_PRECISION"


def _precision_mark(node: pytest.Item) -> str | None:
    mark = node.get_closest_marker("mat_mul_precision")
    if mark is None:
        return None
    level = mark.args[0] if mark.args else mark.kwargs.get("level")
    if level not in _PRECISIONS:
        raise pytest.UsageError(
            f"{node.nodeid}: mat_mul_precision({level!r}): expected one of {', '.join(_PRECISIONS)}"
        )
    return str(level)


@contextlib.contextmanager
def _mat_mul_precision(node: pytest.Item) -> Iterator[None]:
    """The test's ``mat_mul_precision`` mark in the target's torch_xla, set through its own
    binding (silently, as pytorch/xla's test base does) and put back to torch_xla's default
    afterwards."""
    level = _precision_mark(node)
    if level is None:
        yield
        return
    import torch_xla  # the target's: the simulator's, or real torch_xla in a child process

    torch_xla._XLAC._xla_set_mat_mul_precision(level)
    try:
        yield
    finally:
        with warnings.catch_warnings():
            # The simulator warns of a change after device ops; the test is over.
            warnings.simplefilter("ignore")
            torch_xla._XLAC._xla_set_mat_mul_precision("default")


@pytest.fixture(autouse=True)
def _xlasim_mat_mul_precision_env(request: pytest.FixtureRequest) -> None:
    """Under a ``mat_mul_precision`` mark, the simulated processes the test starts (hosts,
    spawned replicas, Ray clusters, ``xlasim run``) start at that level too."""
    level = _precision_mark(request.node)
    if level is not None:
        request.getfixturevalue("monkeypatch").setenv(_PRECISION_ENV, level)


def _run_simulated(request: pytest.FixtureRequest, target: XlaTarget) -> Iterator[XlaTarget]:
    if request.node.get_closest_marker("xlasim_shared") is not None:
        shared: _SharedSimulation = request.getfixturevalue("_xlasim_shared_simulation")
        shared.enter(target)
        with _mat_mul_precision(request.node):
            yield target
        _check_simulated_torch_xla(target)
    else:
        # Nested inside a module's shared runtime, a fresh one must not inherit the process
        # state it left in os.environ (XLA_USE_SPMD, cache paths): start from the environment
        # as it was before the shared runtime opened.
        outer = _OPEN_SHARED[-1].environ_before if _OPEN_SHARED else None
        with _environ(outer), _simulated(target), _mat_mul_precision(request.node):
            yield target


@pytest.fixture
def xlasim_sim(request: pytest.FixtureRequest) -> Iterator[XlaTarget]:
    """The simulator only (honours the topology mark), fresh per test unless xlasim_shared."""
    target = _target("sim", request)
    yield from _run_simulated(request, target)


@pytest.fixture
def tpu_ray_cluster(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A local Ray cluster whose nodes look like the hosts of a simulated TPU slice.

    The slice comes from indirect parametrization (``"4x4"`` or ``("2x2x2", "v4")``), else the
    topology mark, else a v4-16; the cluster is torn down even when the test fails. Ray is
    imported only when a test asks for it.
    """
    # Deferred: the real-target child loads this file without the xlasim package.
    from xlasim.ray.cluster import tpu_ray_cluster_fixture

    yield from tpu_ray_cluster_fixture(request)


# ---------------------------------------------------------------------------------------------
# The target fixture


@pytest.fixture
def xla_target(request: pytest.FixtureRequest) -> Iterator[XlaTarget]:
    """The target this test instance runs on; parametrized over --xla-targets."""
    name = getattr(request, "param", None)
    if name not in TARGETS:
        raise RuntimeError(f"xla_target was not parametrized by the xlasim plugin (got {name!r})")
    target = _target(name, request)
    if name == "sim":
        yield from _run_simulated(request, target)
        return
    if _runs_in_a_child(request, target):
        yield target  # the body runs in a subprocess, see pytest_pyfunc_call
        return
    child = request.config.stash[_child_target_key]
    if child != name:
        raise RuntimeError(f"child pytest for target {child!r} was asked to run target {name!r}")
    _check_no_simulator(target)
    with _mat_mul_precision(request.node):
        yield target
    module = sys.modules.get("torch_xla")
    path = getattr(module, "__file__", None)
    if path and _in_simulator(path):
        raise RuntimeError(f"target {target}: torch_xla resolved to the simulator ({path})")


def _runs_in_a_child(request: pytest.FixtureRequest, target: XlaTarget) -> bool:
    """In the session's own pytest, a real target's test runs in a child pytest: skipped here
    with the reason where the target is missing. False inside that child."""
    if request.config.stash[_child_target_key] is not None:
        return False
    reason = _unavailable(target)
    if reason is not None:
        pytest.skip(f"{target.name} target unavailable: {reason}")
    return True


@pytest.fixture
def torch_tpu_target(request: pytest.FixtureRequest) -> Iterator[XlaTarget]:
    """The target this test instance runs on with TorchTPU loaded (its ``tpu`` device):
    the simulated TorchTPU ('sim') or real TorchTPU ('torch_tpu'); parametrized over
    --xla-targets."""
    name = getattr(request, "param", None)
    if name not in _FIXTURE_TARGETS["torch_tpu_target"]:
        raise RuntimeError(
            f"torch_tpu_target was not parametrized by the xlasim plugin (got {name!r})"
        )
    target = _target(name, request)
    if name == "sim":
        reason = torch_tpu_torch_unsupported()
        if reason is not None:
            pytest.skip(f"sim target unavailable for TorchTPU: {reason}")
        for simulated in _run_simulated(request, target):
            import torch_tpu  # noqa: F401  (inside the simulation: its tpu device loads)

            yield simulated
        return
    if _runs_in_a_child(request, target):
        yield target  # the body runs in a subprocess, see pytest_pyfunc_call
        return
    _check_no_simulator(target)
    import torch_tpu  # noqa: F401  (the real one: the test gets its tpu device loaded)

    yield target


def _check_no_simulator(target: XlaTarget) -> None:
    finders = [f for f in sys.meta_path if type(f).__module__.split(".")[0] == "xlasim"]
    if finders:
        raise RuntimeError(
            f"target {target}: the simulator's import hook is active in the real-target "
            f"subprocess ({finders!r}); is XLASIM_TOPOLOGY set?"
        )


# ---------------------------------------------------------------------------------------------
# Real targets: one subprocess per test


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if pyfuncitem.config.stash[_child_target_key] is not None:
        return None
    callspec = getattr(pyfuncitem, "callspec", None)
    fixture = next(
        (f for f in _FIXTURE_TARGETS if callspec and callspec.params.get(f) in REAL_TARGETS), None
    )
    if fixture is None:
        return None
    target = pyfuncitem.funcargs[fixture]
    assert isinstance(target, XlaTarget)
    _run_in_subprocess(pyfuncitem, target)
    return True


# The child loads this file by path, not as `xlasim.pytest_plugin`: importing the xlasim package
# prepares stock torch for the simulator (device guard, kernels), which must not happen in a
# process that is about to import real torch_xla.
_CHILD_BOOTSTRAP = """\
import importlib.util, sys
spec = importlib.util.spec_from_file_location("_xlasim_pytest_child", sys.argv[1])
plugin = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = plugin
spec.loader.exec_module(plugin)
import pytest
sys.exit(pytest.main(sys.argv[2:], plugins=[plugin]))
"""


def _blocked_plugin_names() -> list[str]:
    """Every name under which pytest could load this plugin from the xlasim package."""
    names = {"xlasim.pytest_plugin"}
    for ep in importlib.metadata.entry_points(group="pytest11"):
        if ep.value == "xlasim.pytest_plugin":
            names.add(ep.name)
    return sorted(names)


def _child_env(target: XlaTarget) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in _CHILD_ENV_DROP and not k.startswith(_CHILD_ENV_DROP_PREFIXES)
    }
    if target.name == "xla_cpu":
        env["PJRT_DEVICE"] = "CPU"
        env["CPU_NUM_DEVICES"] = str(target.num_devices)
    elif target.name == "tpu":
        env["PJRT_DEVICE"] = "TPU"
    return env


def _child_command(item: pytest.Function, target: XlaTarget, workdir: Path) -> list[str]:
    config = item.config
    _, _, rest = item.nodeid.partition("::")
    args = [
        sys.executable,
        "-c",
        _CHILD_BOOTSTRAP,
        str(Path(__file__).resolve()),
        f"{item.path}::{rest}",
        *(arg for name in _blocked_plugin_names() for arg in ("-p", f"no:{name}")),
        f"--xlasim-child={target.name}",
        f"--xlasim-child-report={workdir / 'report.jsonl'}",
        f"--xla-targets={target.name}",
        f"--topology={config.getoption('xla_topology')}",
        f"--rootdir={config.rootpath}",
        f"--basetemp={workdir / 'basetemp'}",
        f"--import-mode={config.getoption('importmode')}",
        "-o",
        "addopts=",
        "-p",
        "no:cacheprovider",
        "-q",
        "--tb=long",
        "--no-header",
        "-rfEsxX",
    ]
    accelerator = config.getoption("xla_accelerator")
    if accelerator is not None:
        args.append(f"--accelerator={accelerator}")
    if config.inipath is not None:
        args += ["-c", str(config.inipath)]
    return args


def _run_in_subprocess(item: pytest.Function, target: XlaTarget) -> None:
    timeout = float(item.config.getoption("xla_timeout"))
    with tempfile.TemporaryDirectory(prefix="xlasim-child-") as tmp:
        workdir = Path(tmp)
        command = _child_command(item, target, workdir)
        started = time.monotonic()
        proc = subprocess.Popen(
            command,
            cwd=item.config.invocation_params.dir,
            env=_child_env(target),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,  # so a timeout kills the child's own children too
        )
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            output, _ = proc.communicate()
            _fail(
                target,
                f"timed out after {timeout:g} s (--xla-timeout) and was killed",
                command,
                output,
            )
        finally:
            if proc.poll() is None:
                _kill_group(proc)
                proc.wait()
        elapsed = time.monotonic() - started
        reports = _read_reports(workdir / "report.jsonl", item.nodeid)
    _judge(target, proc.returncode, reports, command, output, elapsed)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _read_reports(path: Path, nodeid: str) -> dict[str, dict[str, Any]]:
    reports: dict[str, dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            report = json.loads(line)
            if report["nodeid"] == nodeid:
                reports[report["when"]] = report
    return reports


def _fail(target: XlaTarget, what: str, command: list[str], output: str) -> None:
    if len(output) > _OUTPUT_LIMIT:
        cut = len(output) - _OUTPUT_LIMIT
        output = f"[... {cut} characters cut ...]\n" + output[-_OUTPUT_LIMIT:]
    pytest.fail(
        f"target {target}: the test subprocess {what}\n"
        f"command: {_show_command(command)}\n"
        f"{'-' * 30} subprocess output {'-' * 30}\n{output}",
        pytrace=False,
    )


def _show_command(command: list[str]) -> str:
    shown = ["<xlasim child bootstrap>" if arg == _CHILD_BOOTSTRAP else arg for arg in command]
    return shlex.join(shown)


def _judge(
    target: XlaTarget,
    returncode: int,
    reports: dict[str, dict[str, Any]],
    command: list[str],
    output: str,
    elapsed: float,
) -> None:
    failed = [r for r in reports.values() if r["outcome"] == "failed"]
    if failed:
        when = failed[0]["when"]
        if when == "call" and failed[0]["xpass_strict"]:
            return  # the parent's own xfail(strict=True) mark turns the pass into the failure
        what = f"failed in {when} (exit code {returncode}, {elapsed:.1f} s)"
        _fail(target, what, command, output)
    if returncode not in (0, 1):
        _fail(target, f"exited with code {returncode}", command, output)
    if "setup" not in reports or "teardown" not in reports:
        _fail(target, f"did not run the test (exit code {returncode})", command, output)
    for when in ("setup", "call"):
        report = reports.get(when)
        if report is not None and report["outcome"] == "skipped":
            if report["wasxfail"] is not None:
                pytest.xfail(report["wasxfail"])
            # reported at the test's location, not at this line
            raise pytest.skip.Exception(report["reason"], _use_item_location=True)
    if "call" not in reports:
        _fail(target, f"reported no call phase (exit code {returncode})", command, output)


class _ChildReporter:
    """In the child: writes each report as a JSON line for the parent to judge."""

    def __init__(self, path: Path) -> None:
        self._path = path

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        reason = None
        if report.skipped and isinstance(report.longrepr, tuple):
            reason = report.longrepr[2].removeprefix("Skipped: ")
        record = {
            "nodeid": report.nodeid,
            "when": report.when,
            "outcome": report.outcome,
            "reason": reason,
            "wasxfail": getattr(report, "wasxfail", None),
            "xpass_strict": report.failed and str(report.longrepr).startswith("[XPASS(strict)]"),
        }
        with self._path.open("a") as f:
            f.write(json.dumps(record) + "\n")
