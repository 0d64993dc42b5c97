"""Simulated ``torch_xla.runtime``: queries derived from the slice and this process's host.

PYTEST_DONT_REWRITE: its asserts must read exactly as torch_xla's.
"""

from __future__ import annotations

import os
import warnings

import torch_xla
import torch_xla.core.xla_model as xm
from torch_xla.utils import utils as xu

from xlasim.runtime import state


def _rt() -> state.SimRuntime:
    return state.current()


def set_device_type(pjrt_device: str) -> None:
    if torch_xla._XLAC._xla_computation_cache_is_initialized() and pjrt_device != "TPU":
        raise RuntimeError(
            "Can't change device type after XLA runtime is initialized; xlasim simulates TPU"
        )
    if pjrt_device.upper() != "TPU":
        raise NotImplementedError(
            f"xlasim simulates a TPU slice; PJRT device {pjrt_device!r} is not simulated"
        )


def device_type() -> str | None:
    return _rt().device_type


def is_bf16_supported() -> bool:
    return True


def local_process_count() -> int:
    return xu.getenv_as("PJRT_LOCAL_PROCESS_COUNT", int, defval=1)


def global_device_count() -> int:
    return len(torch_xla._XLAC._xla_get_all_devices())


def world_size() -> int:
    if torch_xla._XLAC._xla_get_replication_devices_count() == 0:
        return 1
    return global_device_count()


def local_device_count() -> int:
    return local_process_count() * addressable_device_count()


def addressable_device_count() -> int:
    return torch_xla._XLAC._xla_num_devices()


def global_ordinal() -> int:
    return torch_xla._XLAC._xla_get_default_device_ordinal()


def local_ordinal() -> int:
    local_rank = xu.getenv_as("PJRT_LOCAL_PROCESS_RANK", int, 0)
    return local_rank * addressable_device_count() + torch_xla.device().index


def process_index() -> int:
    return torch_xla._XLAC._xla_get_process_index()


def process_count() -> int:
    return torch_xla._XLAC._xla_get_num_processes()


def host_index() -> int:
    # On TPU, torch_xla reads the worker id of this host.
    return _rt().host_index


def runtime_device_attributes(device: str) -> dict[str, object]:
    return torch_xla._XLAC._xla_get_device_attributes(device)


def global_runtime_device_attributes() -> list[dict[str, object]]:
    return torch_xla._XLAC._xla_get_all_device_attributes()


def global_runtime_device_count() -> int:
    return len(torch_xla._XLAC._xla_get_all_runtime_devices())


def addressable_runtime_device_count() -> int:
    return torch_xla._XLAC._xla_num_runtime_devices()


def use_spmd(auto: bool | None = False) -> None:
    if os.environ.get("XLA_USE_SPMD") is not None:
        warnings.warn(
            "XLA_USE_SPMD is being deprecated. Use torch_xla.runtime.use_spmd() "
            "without setting XLA_USE_SPMD env-var.",
            stacklevel=2,
        )
    if torch_xla._XLAC._xla_get_spmd_config_is_locked() and not xu.check_env_flag("XLA_USE_SPMD"):
        warnings.warn(
            "Replicating tensors already initialized on non-virtual XLA device for SPMD "
            "to force SPMD mode. This is one-time overhead to setup, and to minimize such, "
            "please set SPMD mode before initializting tensors "
            "(i.e., call use_spmd() in the beginning of the program).",
            stacklevel=2,
        )
        xm.wait_device_ops()
    os.environ["XLA_USE_SPMD"] = "1"
    if auto:
        raise NotImplementedError(
            "xlasim does not simulate auto-sharding (torch_xla.runtime.use_spmd(auto=True))"
        )


def is_spmd() -> bool:
    return xu.check_env_flag("XLA_USE_SPMD")


def get_master_ip() -> str:
    # On a TPU, torch_xla asks the TPU metadata for worker 0's address; a simulated slice's
    # hosts all live on this machine.
    hostnames = os.environ.get("TPU_WORKER_HOSTNAMES")
    if hostnames:
        return hostnames.split(",")[0]
    return "127.0.0.1"


def initialize_cache(path: str, readonly: bool = False) -> None:
    assert not torch_xla._XLAC._xla_computation_cache_is_initialized(), (
        "Computation cache has already been initialized"
    )
    os.environ["XLA_PERSISTENT_CACHE_PATH"] = path
    os.environ["XLA_PERSISTENT_CACHE_READ_ONLY"] = "1" if readonly else "0"


def get_num_cached_compilation_graph() -> int:
    return torch_xla._XLAC._xla_get_num_cached_compilation_graph()
