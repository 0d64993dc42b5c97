"""Device memory as ``xm.get_memory_info`` reports it for a simulated TPU chip.

Bytes in use come from the SPMD layer's per-runtime accounting (``xlasim.runtime.memory``: live
tensors transferred to or annotated on the device); the limit is the generation's HBM per chip.
"""

from __future__ import annotations

import torch

from xlasim.runtime import state as _runtime


def device_memory_info(device: torch.device) -> dict[str, int]:
    from xlasim.runtime import memory

    runtime = _runtime.current()
    index = device.index or 0
    used = memory.device_bytes(runtime)[index]
    peaks = runtime.extras.setdefault("peak_bytes", {})
    peaks[index] = max(peaks.get(index, 0), used)
    return {
        "bytes_used": used,
        "bytes_limit": runtime.spec.hbm_bytes_per_chip,
        "peak_bytes_used": peaks[index],
    }
