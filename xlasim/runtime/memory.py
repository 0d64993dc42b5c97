"""Per-chip HBM of simulated device tensors, and the opt-in out-of-memory check.

The totals live in :class:`xlasim.runtime.hbm.HBM` (one per runtime); this module ties
tensors to their buffers.  A device tensor gets a buffer when its data is on the devices
(:func:`settle`): after a transfer or a factory, when a sync materializes it, when it is
resharded.  Values computed since the last sync have no buffer yet -- XLA materializes those
still alive at the next sync -- and are reported apart (``pending_bytes``).

Not modelled: XLA's temporaries inside a program, program memory and allocator
fragmentation, so a real chip needs more than is counted here.

With the check enabled (:func:`enforce_hbm`, ``XLASIM_ENFORCE_HBM=1``), a transfer, factory,
reshard or sync that would push a chip past its HBM fails like PJRT's allocator, before any
host memory is taken for it: ``RuntimeError: ... RESOURCE_EXHAUSTED: Error allocating device
buffer: Attempting to allocate 196.00M. That was not possible. There are 134.44M free.;
(1x0x0_HBM0)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from tpu_backend.topology import SliceSpec
from xlasim.runtime import hbm, state, tpu_device
from xlasim.runtime.hbm import ENFORCE_ENV, human_bytes, layout, layout_of
from xlasim.runtime.state import SimRuntime
from xlasim.sharding.device_layout import device_attributes
from xlasim.sharding.tensor_sharding import TensorSharding

__all__ = [
    "ENFORCE_ENV",
    "chip_memory",
    "device_memory_info",
    "enforce_hbm",
    "human_bytes",
    "report",
    "reserve",
    "reshard",
    "sent_bytes",
    "settle",
]


def settle(rt: SimRuntime, t: Any) -> None:
    """Gives device tensor ``t`` the buffer its data occupies now (see :func:`hbm.settle`)."""
    hbm.settle(rt.memory, rt.spmd, t)


def reserve(
    rt: SimRuntime,
    size: Sequence[int],
    dtype: torch.dtype,
    device_index: int,
    sharding: TensorSharding | None = None,
) -> None:
    """Before the data of a new device tensor is allocated: fails if it cannot fit."""
    shape = tuple(int(d) for d in size)
    devices, nbytes = layout(
        shape, dtype.itemsize, sharding, device_index, rt.spmd, rt.client.num_devices
    )
    rt.memory.check(devices, nbytes)


def reshard(rt: SimRuntime, t: Any, sharding: TensorSharding) -> None:
    """Gives device data ``t`` a new sharding and the buffer that goes with it; on failure
    (it does not fit) ``t`` keeps its old one."""
    previous = t._sharding
    t._sharding = sharding
    try:
        settle(rt, t)
    except BaseException:
        t._sharding = previous
        raise


def sent_bytes(rt: SimRuntime, t: Any) -> int:
    """Bytes a host-to-device transfer of ``t`` (as sharded now) sends from this process:
    one copy per local device it lives on, so a replicated SPMD tensor counts once per device."""
    itemsize = t.dtype.itemsize
    if not rt.spmd:
        return int(t.numel()) * itemsize
    devices, nbytes = layout(tuple(t.shape), itemsize, t._sharding, 0, True, rt.client.num_devices)
    local = rt.addressable_device_ids()
    held = len(local) if devices is None else len(set(devices).intersection(local))
    return nbytes * held


def _pending_device_bytes(rt: SimRuntime) -> list[int]:
    """Per device: values computed since the last sync, alive, with no buffer yet."""
    num_devices = rt.client.num_devices
    totals = [0] * num_devices
    seen: set[int] = set()
    for ref in rt.graphs.pending:
        t = ref()
        if t is None or t._node is None or t._buf is not None or id(t) in seen:
            continue
        seen.add(id(t))
        devices, nbytes = layout_of(t, rt.spmd, num_devices)
        for d in range(num_devices) if devices is None else devices:
            totals[d] += nbytes
    return totals


def _per_chip(spec: SliceSpec, per_device: list[int], num_slices: int = 1) -> list[int]:
    k = spec.devices_per_chip
    return [sum(per_device[c * k : (c + 1) * k]) for c in range(spec.num_chips * num_slices)]


def _slice(rt: SimRuntime) -> SliceSpec:
    """The TPU slice whose chips hold the devices (the PJRT CPU client has no HBM)."""
    spec = rt.client.spec
    if spec is None:
        raise RuntimeError(
            f"xlasim: this process runs the PJRT {rt.client.device_type} client "
            "(PJRT_DEVICE), whose devices are host memory: there is no per-chip HBM to report"
        )
    return spec


def report(rt: SimRuntime) -> list[dict[str, Any]]:
    """One row per chip: index, coords, bytes of buffers, pending bytes, capacity, fraction."""
    spec = _slice(rt)
    attrs = device_attributes(spec, rt.num_slices)
    used = rt.memory.chip_bytes()
    pending = _per_chip(spec, _pending_device_bytes(rt), rt.num_slices)
    rows: list[dict[str, Any]] = []
    if tpu_device.device_count():
        # TorchTPU's one device of this process is its bound chip: its tensors count there
        # (other processes' chips hold theirs, out of this process's sight).
        chip = rt.slice_index * spec.num_chips + rt.host_index * spec.chips_per_host
        used[chip + tpu_device.bound_chip()] += tpu_device.allocated_bytes()
    for chip, nbytes in enumerate(used):
        first = attrs[chip * spec.devices_per_chip]
        row: dict[str, Any] = {"chip": chip}
        if rt.num_slices > 1:
            # Chips are numbered across slices; coords repeat in each slice.
            row["slice_index"] = first["slice_index"]
        row.update(
            coords=first["coords"],
            bytes=nbytes,
            pending_bytes=pending[chip],
            hbm_bytes=spec.hbm_bytes_per_chip,
            fraction=nbytes / spec.hbm_bytes_per_chip,
        )
        rows.append(row)
    return rows


def device_memory_info(device: torch.device) -> dict[str, int]:
    """Device memory as ``xm.get_memory_info`` reports it for a simulated chip's device: bytes
    of live device buffers there, the generation's HBM per chip as the limit."""
    rt = state.current()
    if not rt.client.is_tpu:
        # PJRT's CPU client keeps no allocator statistics.
        raise RuntimeError("Bad StatusOr access: UNIMPLEMENTED: GetAllocatorStats is not supported")
    index = device.index or 0
    used = rt.memory.device_bytes()[index]
    peaks = rt.memory.peak_bytes
    peaks[index] = max(peaks.get(index, 0), used)
    return {
        "bytes_used": used,
        "bytes_limit": _slice(rt).hbm_bytes_per_chip,
        "peak_bytes_used": peaks[index],
    }


# -- the public face (re-exported by ``xlasim``) --------------------------------------------------
def chip_memory() -> list[dict[str, Any]]:
    """Per-chip HBM use of the active simulated slice, one dict per chip.

    ``bytes``: every live device buffer on the chip -- tensors moved to the devices or made
    there (``torch.zeros(..., device=xla)``), and every value a sync materialized
    (parameters, gradients, optimizer state, graph outputs): the whole tensor on each device
    when unsharded or replicated, one padded shard per device when sharded; tensors sharing
    a value (``detach()``) count once.  ``pending_bytes``: values computed since the last sync
    that are still referenced (e.g. activations autograd keeps for backward); XLA holds them
    in buffers from the next sync if they are still alive then.  Also ``chip``, ``coords``,
    ``hbm_bytes`` (the chip's capacity) and ``fraction`` (``bytes / hbm_bytes``).  XLA's
    temporaries, program memory and fragmentation are not counted.  Where a simulated
    ``torch_tpu`` is loaded, the process's ``tpu`` tensors count on the chip it drives.
    """
    return report(state.current())


def enforce_hbm(enabled: bool = True) -> None:
    """Make transfers, factories, reshards and syncs that overflow a chip's HBM fail with
    PJRT's RESOURCE_EXHAUSTED error (also switched on by ``XLASIM_ENFORCE_HBM=1``)."""
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be True or False, got {type(enabled).__name__} {enabled!r}")
    state.current().memory.enforce = enabled
    tpu_device.enforce_hbm(enabled)  # TorchTPU's device, where a simulated torch_tpu is loaded
