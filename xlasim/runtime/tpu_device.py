"""The simulated TorchTPU ``tpu`` device: PyTorch's PrivateUse1 device type, renamed ``tpu``.

Its tensors live in host memory and its ops run eagerly as the CPU kernels do, through the
native backend of :mod:`xlasim.runtime.privateuse1` (compiled into the device extension). Only
float32 and bfloat16 matmul-class ops differ from the CPU: they compute as the TPU's matrix
unit does at TorchTPU's precision (:mod:`xlasim.runtime.numerics`), which shares the active
runtime's mat-mul precision with the simulated torch_xla.

PyTorch allows one name for PrivateUse1 per process and never forgets its hooks, so the first
TorchTPU simulation in a process names the device for good; outside a simulation the device
counts no devices, so a ``tpu`` tensor can neither be made nor used there.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import torch

from xlasim.runtime import device as _device
from xlasim.runtime import numerics
from xlasim.runtime import state as _state

DEVICE_TYPE = "tpu"
DEVICES_PER_PROCESS = 1
"""TorchTPU binds one TPU device to a process (``torch.tpu.set_device`` only validates)."""

_lock = threading.Lock()
_named = False
# The Python kernels of the tpu device (kept: a Library unregisters its kernels when freed).
_kernels: torch.library.Library | None = None

# What TorchTPU's precisions are called by the runtime (StableHLO's DEFAULT, HIGH, HIGHEST).
PRECISION_OF_TORCH = {"medium": "default", "high": "high", "highest": "highest"}
TORCH_OF_PRECISION = {v: k for k, v in PRECISION_OF_TORCH.items()}


def attach(hbm_bytes: int, enforce: bool, emulate_matmuls: bool) -> None:
    """Makes the ``tpu`` device available in this process (a simulation has started), with
    ``hbm_bytes`` of memory, refusing what outgrows it when ``enforce``; its matmul-class ops
    compute at the TPU's precision when ``emulate_matmuls``, else as the CPU does."""
    global _named
    _device.ensure_device_guard()
    with _lock:
        if not _named:
            _name_backend()
            # Before the first activation, which sends every structured op without a tpu
            # kernel to the native fallback: these keep theirs.
            _register_kernels()
            _named = True
    torch.ops.xlasim.tpu_activate(DEVICES_PER_PROCESS, hbm_bytes)
    torch.ops.xlasim.tpu_emulate_matmuls(emulate_matmuls)
    enforce_hbm(enforce)


def enforce_hbm(enabled: bool) -> None:
    """Whether allocations past the device's HBM fail (PJRT's RESOURCE_EXHAUSTED)."""
    if _named:
        torch.ops.xlasim.tpu_enforce_hbm(enabled)


def detach() -> None:
    """Leaves the ``tpu`` device without devices (the simulation has ended)."""
    if _named:
        torch.ops.xlasim.tpu_activate(0, 0)


def bound_chip() -> int:
    """The chip of this host that the process's one ``tpu`` device is.

    Launchers that run one process per chip make only that chip visible to it through
    ``TPU_VISIBLE_CHIPS`` (Ray, for a worker holding ``{"TPU": 1}``); where it names several,
    the device is the first one visible. Without it, a process of a job that TorchTPU's
    launch environment describes (``TORCH_TPU_SLICEBUILDER_ADDRESSES``, one address per
    process) is the chip of its ``LOCAL_RANK``, which TorchTPU's runtime reads; any other
    process sees every chip and its device is the first.
    """
    runtime = _state.active()
    if runtime is None:
        raise RuntimeError("no simulated TPU is attached: there is no chip to bind")
    chips = runtime.spec.chips_per_host
    visible = (os.environ.get("TPU_VISIBLE_CHIPS") or "").replace(" ", "")
    if not visible:
        if not os.environ.get("TORCH_TPU_SLICEBUILDER_ADDRESSES"):
            return 0
        local_rank = (os.environ.get("LOCAL_RANK") or "0").strip()
        if not local_rank.isdigit() or int(local_rank) >= chips:
            raise ValueError(
                f"LOCAL_RANK={local_rank!r}: a host of {runtime.spec.pod_type} has chips "
                f"0..{chips - 1}, one per local rank"
            )
        return int(local_rank)
    first = visible.split(",")[0]
    if not first.isdigit() or int(first) >= chips:
        raise ValueError(
            f"TPU_VISIBLE_CHIPS={visible!r}: a host of {runtime.spec.pod_type} has chips "
            f"0..{chips - 1}"
        )
    return int(first)


def allocated_bytes() -> int:
    """Bytes of live ``tpu`` tensors in this process (the device allocator's count); 0 where
    no simulated TorchTPU is loaded."""
    if not _named or not device_count():
        return 0
    return int(torch.accelerator.memory_allocated(torch.device(DEVICE_TYPE, 0)))


def device_count() -> int:
    """The ``tpu`` devices of this process: one inside a simulation, none outside one."""
    # The native backend's hooks (torch.accelerator.device_count() would ask torch.tpu).
    return int(torch._C._accelerator_hooks_device_count()) if _named else 0


def _name_backend() -> None:
    # Run once per process, before anything of ours has named the device: a name already
    # there ("tpu" included: the real TorchTPU) belongs to another backend.
    name = torch._C._get_privateuse1_backend_name()
    if name != "privateuseone":
        raise RuntimeError(
            f"xlasim cannot simulate TorchTPU in this process: PyTorch's PrivateUse1 device "
            f"is already named {name!r} (another device backend is loaded); run the "
            "simulation in a fresh process, e.g. `xlasim run -- python ...`"
        )
    torch.utils.rename_privateuse1_backend(DEVICE_TYPE)
    # Tensor.is_tpu, Tensor.tpu(), Module.tpu(), ... as TorchTPU's loader generates them.
    torch.utils.generate_methods_for_privateuse1_backend()


def precision() -> str | None:
    """The precision float32 matmuls on ``tpu`` tensors run at, or None for exact CPU ones."""
    runtime = _state.active()
    if runtime is None or runtime.numerics == "exact" or runtime.dry_run:
        return None
    return runtime.mat_mul_precision


def cpu_view(t: torch.Tensor) -> torch.Tensor:
    """The CPU tensor over the same host memory as ``tpu`` tensor ``t``."""
    return torch.ops.xlasim.tpu_cpu_view.default(t)


def from_cpu(t: torch.Tensor, index: int = 0) -> torch.Tensor:
    """A ``tpu`` tensor with the values of CPU tensor ``t``."""
    return torch.ops.xlasim.tpu_from_cpu.default(t, index)


def default_generator(index: int = 0) -> torch.Generator:
    return torch.ops.xlasim.tpu_generator.default(index)


def _on_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.device.type == DEVICE_TYPE:
        return cpu_view(value)
    if isinstance(value, list | tuple):
        return type(value)(_on_cpu(v) for v in value)
    return value


def _on_tpu(value: Any, index: int) -> Any:
    if isinstance(value, torch.Tensor):
        return from_cpu(value, index) if value.device.type == "cpu" else value
    if isinstance(value, list | tuple):
        return type(value)(_on_tpu(v, index) for v in value)
    return value


def _matmul_kernel(op: Any) -> Callable[..., Any]:
    compute = numerics.emulated(op, precision)
    assert compute is not None

    def kernel(*args: Any, **kwargs: Any) -> Any:
        index = next((a.device.index or 0 for a in args if isinstance(a, torch.Tensor)), 0)
        out = compute(*_on_cpu(args), **{k: _on_cpu(v) for k, v in kwargs.items()})
        return _on_tpu(out, index)

    return kernel


# Functional ops whose generic kernel for a device without its own (allocate the result, then
# call the out= form) makes the CPU's out= kernel warn that it resized the result: the CPU's
# functional kernel runs instead.
_CPU_FUNCTIONAL = (torch.ops.aten.mse_loss.default,)


def _register_kernels() -> None:
    """Matmul-class ops on ``tpu`` tensors at the TPU's precision, and the functional ops of
    ``_CPU_FUNCTIONAL`` as the CPU computes them (every other op reaches the native fallback,
    which runs the CPU kernel). The Python kernels sit under PrivateUse3, where the native
    router of the matmul-class ops sends a call when the numerics are emulated."""
    global _kernels
    lib = torch.library.Library("aten", "IMPL", "PrivateUse3")
    for op in numerics.MATMUL_CLASS:
        lib.impl(_impl_name(op), _matmul_kernel(op))
    _kernels = lib
    torch.ops.xlasim.tpu_route(
        [_impl_name(op) for op in numerics.MATMUL_CLASS], [_impl_name(op) for op in _CPU_FUNCTIONAL]
    )


def _impl_name(op: Any) -> str:
    name = op._overloadname
    return op._schema.name.split("::")[1] + ("" if name == "default" else f".{name}")
