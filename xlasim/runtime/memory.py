"""Per-chip HBM accounting for simulated device tensors, with an opt-in out-of-memory check.

Each live device tensor occupies, on every device that holds a piece of it:
  * unsharded, under SPMD: the whole tensor (torch_xla replicates unannotated data);
  * unsharded, without SPMD: the whole tensor on its own device only;
  * replicated: the whole tensor;
  * tiled / partially replicated: one padded shard (``ShardingUtil::GetShardShape``).
A chip holds the sum over its devices (2 per chip on v2/v3/v7x).  This counts live buffers
only -- XLA's temporaries, program memory and allocator fragmentation are not modelled -- so
it is a lower bound of real HBM use; a sharding that does not fit here does not fit on TPU.

With the check enabled, a transfer that would push a chip past its HBM fails like PJRT's
allocator does: ``RuntimeError: ... RESOURCE_EXHAUSTED: Error allocating device buffer:
Attempting to allocate 196.00M. That was not possible. There are 134.44M free.; (1x0x0_HBM0)``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import torch

from tpu_backend.topology import SliceSpec
from xlasim.runtime import state
from xlasim.runtime.state import SimRuntime
from xlasim.sharding.device_layout import device_attributes
from xlasim.sharding.tensor_sharding import TensorSharding

ENFORCE_ENV = "XLASIM_ENFORCE_HBM"


def _enforcing(rt: SimRuntime) -> bool:
    if rt.memory.enforce is None:
        # Read at first use, so a program may set the variable after entering the simulation.
        flag = os.environ.get(ENFORCE_ENV, "0").lower()
        rt.memory.enforce = flag in ("1", "true", "yes", "on")
    return rt.memory.enforce


def human_bytes(num_bytes: int) -> str:
    """tsl ``strings::HumanReadableNumBytes`` (what PJRT's allocator messages print)."""
    if num_bytes < 0:
        return "-" + human_bytes(-num_bytes)
    if num_bytes < 1024:
        return f"{num_bytes}B"
    units = "KMGTPE"
    unit = 0
    while num_bytes >= 1024 * 1024:
        num_bytes //= 1024
        unit += 1
    fmt = "{:.1f}{}" if units[unit] == "K" else "{:.2f}{}"
    return fmt.format(num_bytes / 1024.0, units[unit])


def _itemsize(t: Any) -> int:
    return int(t.element_size())


def tensor_device_bytes(
    t: Any, sharding: TensorSharding | None, num_devices: int, spmd: bool
) -> dict[int, int]:
    """Bytes each device ordinal holds for ``t`` (global shape ``t.shape``)."""
    itemsize = _itemsize(t)
    full = int(t.numel()) * itemsize
    if sharding is None:
        if spmd:
            return dict.fromkeys(range(num_devices), full)
        index = t.device.index or 0
        return {index: full}
    if sharding.is_replicated or sharding.is_manual:
        return dict.fromkeys(range(num_devices), full)
    shard = 1
    for d in sharding.shard_shape():
        shard *= d
    return dict.fromkeys(sharding.devices(), shard * itemsize)


def sent_bytes(rt: SimRuntime, t: Any) -> int:
    """Bytes a host-to-device transfer of ``t`` (as sharded now) sends from this process:
    one copy per local device it lives on, so a replicated SPMD tensor counts once per device."""
    if not rt.spmd:
        return int(t.numel()) * _itemsize(t)
    held = tensor_device_bytes(t, t._sharding, len(rt.global_device_ids()), True)
    return sum(held.get(d, 0) for d in rt.addressable_device_ids())


def _live_tensors(rt: SimRuntime) -> list[Any]:
    """Every live simulated device tensor this runtime knows of."""
    return list(rt.memory.tracked.values())


def device_bytes(rt: SimRuntime, tensors: Iterable[Any] | None = None) -> list[int]:
    """Bytes per device ordinal for ``tensors`` (default: all live device tensors)."""
    num_devices = rt.client.num_devices
    totals = [0] * num_devices
    for t in _live_tensors(rt) if tensors is None else tensors:
        for device, nbytes in tensor_device_bytes(
            t, getattr(t, "_sharding", None), num_devices, rt.spmd
        ).items():
            totals[device] += nbytes
    return totals


def chip_bytes(rt: SimRuntime, tensors: Iterable[Any] | None = None) -> list[int]:
    """Bytes per chip (chip ``c`` holds devices ``c*devices_per_chip ...``)."""
    spec = _slice(rt)
    per_device = device_bytes(rt, tensors)
    k = spec.devices_per_chip
    return [sum(per_device[c * k : (c + 1) * k]) for c in range(spec.num_chips)]


def _slice(rt: SimRuntime) -> SliceSpec:
    """The TPU slice whose chips hold the devices (the PJRT CPU client has no HBM)."""
    spec = rt.client.spec
    if spec is None:
        raise RuntimeError(
            f"xlasim: this process runs the PJRT {rt.client.device_type} client "
            "(PJRT_DEVICE), whose devices are host memory: there is no per-chip HBM to report"
        )
    return spec


def _hbm_name(rt: SimRuntime, device: int) -> str:
    attrs = device_attributes(_slice(rt))[device]
    x, y, z = attrs["coords"]
    return f"{x}x{y}x{z}_HBM{attrs['core_on_chip']}"


def check_fits(rt: SimRuntime, t: Any, new: TensorSharding | None) -> None:
    """Before ``t`` takes sharding ``new``: fail as PJRT would if a chip overflows; else track."""
    if rt.client.is_tpu and _enforcing(rt):
        spec = _slice(rt)
        others = [o for o in _live_tensors(rt) if o is not t]
        per_chip = chip_bytes(rt, others)
        need = tensor_device_bytes(t, new, spec.num_devices, rt.spmd)
        capacity = spec.hbm_bytes_per_chip
        for device in sorted(need):
            chip = device // spec.devices_per_chip
            if per_chip[chip] + need[device] > capacity:
                free = capacity - per_chip[chip]
                raise RuntimeError(
                    "Bad StatusOr access: RESOURCE_EXHAUSTED: Error allocating device buffer: "
                    f"Attempting to allocate {human_bytes(need[device])}. That was not "
                    f"possible. There are {human_bytes(max(free, 0))} free.; "
                    f"({_hbm_name(rt, device)})"
                )
            per_chip[chip] += need[device]
    rt.memory.tracked[id(t)] = t


def report(rt: SimRuntime) -> list[dict[str, Any]]:
    """One row per chip: index, coords, bytes used, HBM capacity, fraction used."""
    spec = _slice(rt)
    attrs = device_attributes(spec)
    used = chip_bytes(rt)
    rows = []
    for chip, nbytes in enumerate(used):
        rows.append(
            {
                "chip": chip,
                "coords": attrs[chip * spec.devices_per_chip]["coords"],
                "bytes": nbytes,
                "hbm_bytes": spec.hbm_bytes_per_chip,
                "fraction": nbytes / spec.hbm_bytes_per_chip,
            }
        )
    return rows


def device_memory_info(device: torch.device) -> dict[str, int]:
    """Device memory as ``xm.get_memory_info`` reports it for a simulated chip's device: bytes
    of live device tensors in use there, the generation's HBM per chip as the limit."""
    rt = state.current()
    if not rt.client.is_tpu:
        # PJRT's CPU client keeps no allocator statistics.
        raise RuntimeError("Bad StatusOr access: UNIMPLEMENTED: GetAllocatorStats is not supported")
    index = device.index or 0
    used = device_bytes(rt)[index]
    peaks = rt.memory.peak_bytes
    peaks[index] = max(peaks.get(index, 0), used)
    return {
        "bytes_used": used,
        "bytes_limit": _slice(rt).hbm_bytes_per_chip,
        "peak_bytes_used": peaks[index],
    }


# -- the public face (re-exported by ``xlasim``) --------------------------------------------------
def chip_memory() -> list[dict[str, Any]]:
    """Per-chip HBM use of the active simulated slice (see :func:`report`)."""
    return report(state.current())


def enforce_hbm(enabled: bool = True) -> None:
    """Make transfers that overflow a chip's HBM fail with PJRT's RESOURCE_EXHAUSTED error
    (also switched on by ``XLASIM_ENFORCE_HBM=1``)."""
    state.current().memory.enforce = bool(enabled)
