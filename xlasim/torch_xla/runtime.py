"""Simulated ``torch_xla.runtime``: queries derived from the slice and this process's host.

PYTEST_DONT_REWRITE: its asserts must read exactly as torch_xla's.
"""

from __future__ import annotations

import os
import warnings

import torch_xla
import torch_xla._internal.tpu as tpu
import torch_xla.core.xla_env_vars as xenv
from torch_xla.utils import utils as xu

from xlasim.runtime import state


def _rt() -> state.SimRuntime:
    return state.current()


def set_device_type(pjrt_device: str) -> None:
    """Chooses the PJRT client (``'TPU'``, ``'CPU'``) before the runtime starts."""
    if (
        torch_xla._XLAC._xla_runtime_is_initialized()
        and os.environ.get(xenv.PJRT_DEVICE) != pjrt_device
    ):
        raise RuntimeError("Can't change device type after XLA runtime is initialized")
    os.environ[xenv.PJRT_DEVICE] = pjrt_device


def _maybe_select_default_device() -> None:
    """At import: with no ``PJRT_DEVICE`` set, pick the TPU the simulated host has."""
    selecting = xu.getenv_as(xenv.PJRT_SELECT_DEFAULT_DEVICE, str, "1") != "0"
    if selecting and xenv.PJRT_DEVICE not in os.environ:
        os.environ[xenv.PJRT_DEVICE] = "TPU" if tpu.num_available_chips() > 0 else "CPU"


def device_type() -> str | None:
    """The PJRT device type named by ``PJRT_DEVICE`` (read anew on every call)."""
    pjrt_device = xu.getenv_as(xenv.PJRT_DEVICE, str)
    return pjrt_device.split("_")[0] if pjrt_device else pjrt_device


def is_bf16_supported() -> bool:
    return True


def _env_int(name: str, default: int) -> int:
    # Set by launchers that start several processes per host (not the simulator itself).
    value = os.environ.get(name)
    return default if value is None else int(value)


def local_process_count() -> int:
    return _env_int("PJRT_LOCAL_PROCESS_COUNT", 1)


def global_device_count() -> int:
    """Devices torch_xla hands out: every device of the slice, or the one virtual SPMD device."""
    rt = _rt()
    return 1 if rt.spmd else len(rt.global_device_ids())


def world_size() -> int:
    # Replication is what xm.set_replication (xmp.spawn, accelerate) sets up; without it a
    # process is a world of one. torch_xla keeps its first answer for the process.
    rt = _rt()
    if rt.world_size is None:
        rt.world_size = global_device_count() if rt.replication_devices else 1
    return rt.world_size


def local_device_count() -> int:
    return local_process_count() * addressable_device_count()


def addressable_device_count() -> int:
    return len(_rt().xla_devices())


def global_ordinal() -> int:
    return _rt().default_ordinal()


def local_ordinal() -> int:
    # Each local process owns a block of addressable devices.
    first = _env_int("PJRT_LOCAL_PROCESS_RANK", 0) * addressable_device_count()
    return first + torch_xla.device().index


def process_index() -> int:
    return _rt().client.process_index


def process_count() -> int:
    return _rt().client.num_processes


def host_index() -> int:
    return tpu.worker_id() if device_type() == "TPU" else 0


def runtime_device_attributes(device: str) -> dict[str, object]:
    return torch_xla._XLAC._xla_get_device_attributes(device)


def global_runtime_device_attributes() -> list[dict[str, object]]:
    return torch_xla._XLAC._xla_get_all_device_attributes()


def global_runtime_device_count() -> int:
    """Every device of the PJRT client (each chip of the slice), SPMD or not."""
    return len(_rt().global_device_ids())


def addressable_runtime_device_count() -> int:
    return len(_rt().addressable_device_ids())


def use_spmd(auto: bool | None = False) -> None:
    """Turns SPMD on for this process (the environment flag every query reads)."""
    if "XLA_USE_SPMD" in os.environ:
        warnings.warn(
            "XLA_USE_SPMD is being deprecated. Use torch_xla.runtime.use_spmd() "
            "without setting XLA_USE_SPMD env-var.",
            stacklevel=2,
        )
    rt = _rt()
    if rt.devices_used and not rt.spmd:
        # Real torch_xla then waits for in-flight work and replicates the existing data;
        # simulated work is never in flight and the values need no copying.
        warnings.warn(
            "Replicating tensors already initialized on non-virtual XLA device for SPMD "
            "to force SPMD mode. This is one-time overhead to setup, and to minimize such, "
            "please set SPMD mode before initializting tensors "
            "(i.e., call use_spmd() in the beginning of the program).",
            stacklevel=2,
        )
    os.environ["XLA_USE_SPMD"] = "1"
    if auto:
        raise NotImplementedError(
            "xlasim does not simulate auto-sharding (torch_xla.runtime.use_spmd(auto=True))"
        )


def is_spmd() -> bool:
    return _rt().spmd


def get_master_ip() -> str:
    if device_type() == "TPU":
        return tpu.discover_master_worker_ip()
    raise RuntimeError(f"IP discovery not supported for device: {device_type()}")


def initialize_cache(path: str, readonly: bool = False) -> None:
    # The runtime reads both variables when it builds its compilation cache (first compile).
    assert not _rt().graphs.initialized, "Computation cache has already been initialized"
    os.environ.update(
        XLA_PERSISTENT_CACHE_PATH=path, XLA_PERSISTENT_CACHE_READ_ONLY="1" if readonly else "0"
    )


def get_num_cached_compilation_graph() -> int:
    return len(_rt().graphs.compiled)
