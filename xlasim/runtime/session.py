"""Entering and leaving a simulated runtime: the torch side of ``xlasim.simulate()``.

The outermost simulation of a process attaches the simulated ``xla`` device to torch (device
guard, factory kernels) and checks that autograd can still use it; when the last one is left
the factory kernels are removed again, so a process that loads the real torch_xla later finds
stock torch.  Every entry runs on a fresh :class:`SimRuntime`.
"""

from __future__ import annotations

import os

import torch

from tpu_backend.topology import SliceSpec
from xlasim.runtime import graph, state
from xlasim.runtime.device import check_autograd_engine, ensure_device_guard
from xlasim.runtime.dry_run import ShapeOnlyFactories
from xlasim.runtime.run_options import LIBTPU
from xlasim.runtime.tensor import FACTORY_KERNELS, wrap_data

_autograd_checked = False
# The factory redirection of each active dry-run runtime, by id (entered and left with it).
_dry_run_modes: dict[int, ShapeOnlyFactories] = {}


def attach_device(spec: SliceSpec) -> None:
    """Routes ``xla`` tensors to the simulator (outermost entry); see :func:`detach_device`."""
    ensure_device_guard()
    FACTORY_KERNELS.register()
    try:
        _check_autograd(spec)
    except BaseException:
        detach_device()
        raise


def detach_device() -> None:
    FACTORY_KERNELS.unregister()


def _check_autograd(spec: SliceSpec) -> None:
    """The one-time autograd check, on a throwaway runtime so that no state leaks."""
    global _autograd_checked
    if _autograd_checked:
        return
    scratch = state.SimRuntime(spec)
    state.push(scratch)
    try:
        check_autograd_engine(lambda: wrap_data(torch.zeros(1), None))
    finally:
        state.pop(scratch)
    _autograd_checked = True


def enter(
    spec: SliceSpec, host_index: int, *, compiler: str | None = None, dry_run: bool = False
) -> state.SimRuntime:
    """Makes a fresh runtime for host ``host_index`` the active one.

    ``compiler`` (checked by ``run_options``) attaches the real compiler every graph also
    goes to; ``dry_run`` makes values shape-only, CPU-side factories included.
    """
    runtime = state.SimRuntime(spec, host_index, dry_run=dry_run)
    if compiler == LIBTPU:
        # Deferred: the compile layer imports jax, an optional extra that only a simulation
        # asking for the compiler may load.
        from xlasim.runtime.libtpu_compiler import LibtpuCompiler

        runtime.graphs.compiler = LibtpuCompiler(spec)
    runtime.save_env()
    # On a TPU VM `import torch_xla` selects PJRT_DEVICE=TPU; so does the simulation.
    os.environ["PJRT_DEVICE"] = "TPU"
    state.push(runtime)
    if dry_run:
        mode = _dry_run_modes[id(runtime)] = ShapeOnlyFactories()
        mode.__enter__()
    _follow(runtime)
    return runtime


def leave(runtime: state.SimRuntime) -> None:
    mode = _dry_run_modes.pop(id(runtime), None)
    if mode is not None:
        mode.__exit__(None, None, None)
    state.pop(runtime)
    runtime.restore_env()
    _follow(state.active())


def _follow(runtime: state.SimRuntime | None) -> None:
    """Process-wide switches follow the active runtime: ops keep their arguments for a
    compiler only while one is attached (otherwise the dispatcher pays one flag test)."""
    graph.RECORD_CALLS = runtime is not None and runtime.graphs.compiler is not None
