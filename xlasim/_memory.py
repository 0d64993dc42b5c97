"""Device memory as ``xm.get_memory_info`` reports it for a simulated TPU chip.

Bytes in use are the live simulated tensors on the device (views counted once, by storage);
the limit is the generation's HBM per chip. The SPMD layer refines this per chip for sharded
tensors.
"""

from __future__ import annotations

import gc

import torch

from xlasim import _runtime


def live_device_bytes(device_index: int) -> int:
    from xlasim._tensor import XlaSimTensor

    seen: set[int] = set()
    total = 0
    for obj in gc.get_objects():
        if type(obj) is XlaSimTensor and obj.device.index == device_index:
            storage = obj._elem.untyped_storage()
            key = storage.data_ptr()
            if key not in seen:
                seen.add(key)
                total += storage.nbytes()
    return total


def device_memory_info(device: torch.device) -> dict[str, int]:
    runtime = _runtime.current()
    index = device.index or 0
    used = live_device_bytes(index)
    peaks = runtime.extras.setdefault("peak_bytes", {})
    peaks[index] = max(peaks.get(index, 0), used)
    return {
        "bytes_used": used,
        "bytes_limit": runtime.spec.hbm_bytes_per_chip,
        "peak_bytes_used": peaks[index],
    }
