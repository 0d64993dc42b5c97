"""Python numbers an op takes, as torch_xla 2.9 moves them to the devices.

torch_xla gives a number in a tensor or ``Scalar`` argument (``t * 2``, ``t.add(u,
alpha=3)``, ``fill_(4.5)``, a 0-dim CPU tensor) an IR value of device data, except 0, 1 and
-1, which it writes into the graph as constants. The data comes from a cache of the values
already moved (per device; the one SPMD device under SPMD), keyed by the value in the dtype
it is moved as, 16-bit floats moved as float32; it holds the last 128 values. A miss is one
host-to-device transfer, counted as one ``DeviceDataCacheMiss``, one ``TransferToDeviceTime``
sample and one ``CreateDataHandles`` per device the data lands on (measured on torch_xla 2.9,
PJRT CPU: ``t * 2`` then ``t * 2.0`` moves one value, ``t * 1`` none, 4 handles under SPMD
on 4 devices).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

import torch

CACHE_SIZE = 128
"""torch's lazy-tensor device-data cache size (``torch_lazy_device_data_cache_size``)."""

_SPECIAL = (0, 1, -1)
_MOVED_AS = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


class ScalarData:
    """The values a runtime has moved to its devices for numbers, most recent last."""

    __slots__ = ("_moved",)

    def __init__(self) -> None:
        self._moved: OrderedDict[tuple[Any, ...], None] = OrderedDict()

    def use(self, rt: Any, value: Any, dtype: torch.dtype, device_index: int) -> None:
        """Number ``value`` used by an op computing in ``dtype``: moved unless it is a
        constant in the graph or its data is cached."""
        if value in _SPECIAL:
            return
        moved_as = _MOVED_AS.get(dtype, dtype)
        as_dtype = torch.tensor(value).to(moved_as)
        key = (0 if rt.spmd else device_index, moved_as, as_dtype.item())
        if key in self._moved:
            self._moved.move_to_end(key)
            return
        start = time.perf_counter_ns()
        self._moved[key] = None
        if len(self._moved) > CACHE_SIZE:
            self._moved.popitem(last=False)
        devices = len(rt.addressable_device_ids()) if rt.spmd else 1
        metrics = rt.metrics
        metrics.inc("DeviceDataCacheMiss")
        metrics.inc("CreateDataHandles", devices)
        metrics.to_device(as_dtype.element_size() * devices, start)
