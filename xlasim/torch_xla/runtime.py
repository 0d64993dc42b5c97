"""Simulated ``torch_xla.runtime``: queries derived from the slice and this process's host.

PYTEST_DONT_REWRITE: its asserts must read exactly as torch_xla's.
"""

from __future__ import annotations

import os
import warnings

import torch_xla

from xlasim.runtime import state


def _rt() -> state.SimRuntime:
    return state.current()


def set_device_type(pjrt_device: str) -> None:
    if _rt().graphs.initialized and pjrt_device != "TPU":
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


def _env_int(name: str, default: int) -> int:
    # Set by launchers that start several processes per host (not the simulator itself).
    value = os.environ.get(name)
    return default if value is None else int(value)


def local_process_count() -> int:
    return _env_int("PJRT_LOCAL_PROCESS_COUNT", 1)


def global_device_count() -> int:
    """Devices torch_xla hands out: every device of the slice, or the one virtual SPMD device."""
    rt = _rt()
    return 1 if rt.spmd else rt.spec.num_devices


def world_size() -> int:
    # Replication is what xmp.spawn sets up; without it a process is a world of one.
    return global_device_count() if _rt().replication_devices else 1


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
    return _rt().host_index


def process_count() -> int:
    return _rt().spec.num_hosts


def host_index() -> int:
    # On TPU, torch_xla reads the worker id of this host.
    return _rt().host_index


def runtime_device_attributes(device: str) -> dict[str, object]:
    return torch_xla._XLAC._xla_get_device_attributes(device)


def global_runtime_device_attributes() -> list[dict[str, object]]:
    return torch_xla._XLAC._xla_get_all_device_attributes()


def global_runtime_device_count() -> int:
    """Every chip of the slice, SPMD or not."""
    return _rt().spec.num_devices


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
    # On a TPU, torch_xla asks the TPU metadata for worker 0's address; a simulated slice's
    # hosts all live on this machine.
    hostnames = os.environ.get("TPU_WORKER_HOSTNAMES")
    if hostnames:
        return hostnames.split(",")[0]
    return "127.0.0.1"


def initialize_cache(path: str, readonly: bool = False) -> None:
    # The runtime reads both variables when it builds its compilation cache (first compile).
    assert not _rt().graphs.initialized, "Computation cache has already been initialized"
    os.environ.update(
        XLA_PERSISTENT_CACHE_PATH=path, XLA_PERSISTENT_CACHE_READ_ONLY="1" if readonly else "0"
    )


def get_num_cached_compilation_graph() -> int:
    return len(_rt().graphs.compiled)
