"""Loading the simulated TorchTPU into torch: what ``import torch_tpu`` does.

As TorchTPU's loader, it initializes only where it finds TPU chips (inside a simulation, the
simulated host's): it names PyTorch's PrivateUse1 device ``tpu``, registers ``torch.tpu`` as
its device module and TorchDynamo's device interface, registers the ``tpu_dist`` and ``tpu``
process-group backends, maps ``torch.set_float32_matmul_precision`` onto the TPU's matmul
precision (``medium`` = DEFAULT, ``high`` = HIGH, ``highest`` = HIGHEST), and has
``torch.compile`` compile graphs with tpu inputs with its ``"tpu"`` backend. ``torch.tpu`` and its
public modules are installed either way, as TorchTPU installs them on import.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
from typing import Any, Final

import torch
import torch_tpu._internal.compile as compile_backend
from torch._dynamo.device_interface import (
    DeviceInterface,
    get_interface_for_device,
    register_interface_for_device,
)
from torch_tpu._internal import public_api
from torch_tpu._internal.device import _device_module
from torch_tpu._internal.distributed import tpu_distributed
from torch_tpu._internal.utils import hardware

from xlasim.runtime import session, state, tpu_device

_AUTOLOAD_ENV_VAR: Final[str] = "TORCH_DEVICE_BACKEND_AUTOLOAD"

_INIT_LOCK = threading.Lock()
_LOADED: bool = False

_PRECISION_ERROR = "expected to be one of 'highest', 'high', or 'medium', got"

public_api.install()


class TpuDeviceInterface(_device_module.TpuDeviceModule, DeviceInterface):
    """The ``tpu`` device as TorchDynamo asks about it."""

    @staticmethod
    def get_compute_capability(device: Any = None) -> str:
        return ""  # TPUs have no CUDA-style compute capability

    @staticmethod
    def is_triton_capable(device: Any = None) -> bool:
        return False

    @staticmethod
    def is_gpu() -> bool:
        return False


_torch_set_precision = torch.set_float32_matmul_precision
_torch_get_precision = torch.get_float32_matmul_precision


@functools.wraps(_torch_set_precision)
def _tpu_set_precision(precision: str) -> None:
    runtime = state.active()
    if runtime is None:  # outside a simulation: no TPU, PyTorch's own setting
        _torch_set_precision(precision)
        return
    level = tpu_device.PRECISION_OF_TORCH.get(precision)
    if level is None:
        raise ValueError(f"{_PRECISION_ERROR} '{precision}'")
    runtime.mat_mul_precision = level


@functools.wraps(_torch_get_precision)
def _tpu_get_precision() -> str:
    runtime = state.active()
    if runtime is None:
        return _torch_get_precision()
    level = runtime.mat_mul_precision
    if level not in tpu_device.TORCH_OF_PRECISION:
        raise ValueError(f"{_PRECISION_ERROR} {level}")
    return tpu_device.TORCH_OF_PRECISION[level]


def _init_device_impl(device: str) -> torch.device:
    assert device == "tpu"  # the only device TorchTPU knows
    hardware.bound_chip()  # a chip the host lacks fails the load, not a later op
    session.attach_tpu(state.current())
    with contextlib.suppress(NotImplementedError):
        get_interface_for_device(device)  # torch's own entry first, so ours replaces it
    register_interface_for_device(device, TpuDeviceInterface)
    module = sys.modules[f"torch.{device}"]
    if hasattr(torch, device):
        delattr(torch, device)  # installed on import; registering puts it back
    torch._register_device_module(device, module)
    if torch.distributed.is_available():
        tpu_distributed.register()
    torch.set_float32_matmul_precision = _tpu_set_precision
    torch.get_float32_matmul_precision = _tpu_get_precision
    compile_backend.install()
    return torch.device(device)


def _init_device(device: str) -> torch.device:
    with _INIT_LOCK:
        return _init_device_impl(device)


def load() -> None:
    """Loads the backend where there are TPU chips; sets ``_LOADED`` when it has."""
    global _LOADED
    if _LOADED:
        return
    if hardware.get_tpu_device_count():
        _init_device("tpu")
        _LOADED = True


if os.getenv(_AUTOLOAD_ENV_VAR, "1") == "1":
    load()
