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
from xlasim.runtime import state
from xlasim.runtime.device import check_autograd_engine, ensure_device_guard
from xlasim.runtime.tensor import FACTORY_KERNELS, wrap_data

_autograd_checked = False


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


def enter(spec: SliceSpec, host_index: int) -> state.SimRuntime:
    """Makes a fresh runtime for host ``host_index`` the active one."""
    runtime = state.SimRuntime(spec, host_index)
    runtime.save_env()
    # On a TPU VM `import torch_xla` selects PJRT_DEVICE=TPU; so does the simulation.
    os.environ["PJRT_DEVICE"] = "TPU"
    state.push(runtime)
    return runtime


def leave(runtime: state.SimRuntime) -> None:
    state.pop(runtime)
    runtime.restore_env()
