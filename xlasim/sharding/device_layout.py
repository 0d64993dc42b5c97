"""Where each simulated device sits on the slice: ``xr.global_runtime_device_attributes()``.

Real TPU PJRT devices report ``coords`` (the chip's [x, y, z] in the slice torus),
``core_on_chip``, ``num_cores`` and ``name`` ('TPU:<id>'); multislice runs add
``slice_index`` (torch_xla 2.9 docs/source/perf/spmd_basic.md, test_runtime_tpu.py).  A
single-slice run has no ``slice_index`` key, which is what ``HybridMesh`` checks to tell the
two apart.

Device ids follow the slice's hosts: host ``h`` owns ids ``h*devices_per_host ...`` (the
contiguous range ``SimRuntime.addressable_device_ids`` reports), hosts tile the chip grid as
``TPU_HOST_BOUNDS`` blocks of ``TPU_CHIPS_PER_HOST_BOUNDS`` chips, x fastest, and the cores of
a chip are consecutive ids.  On one v4-8 host this gives TPU:0 [0,0,0], TPU:1 [1,0,0],
TPU:2 [0,1,0], TPU:3 [1,1,0] -- the documented layout.
"""

from __future__ import annotations

import itertools
from typing import Any, Protocol


class SliceLike(Protocol):
    # Read-only members, so the frozen SliceSpec satisfies it.
    @property
    def num_hosts(self) -> int: ...
    @property
    def devices_per_chip(self) -> int: ...
    @property
    def host_bounds(self) -> tuple[int, int, int]: ...
    @property
    def chips_per_host_bounds(self) -> tuple[int, int, int]: ...


def _xyz_order(bounds: tuple[int, int, int]) -> list[tuple[int, int, int]]:
    # itertools.product varies the last factor fastest; reverse so x varies fastest.
    return [(x, y, z) for z, y, x in itertools.product(*(range(b) for b in reversed(bounds)))]


def device_attributes(spec: SliceLike, num_slices: int = 1) -> list[dict[str, Any]]:
    """Attributes of every device of ``num_slices`` copies of ``spec``, in device-id order."""
    if isinstance(num_slices, bool) or not isinstance(num_slices, int) or num_slices < 1:
        raise ValueError(f"num_slices must be a positive int, got {num_slices!r}")
    hosts = _xyz_order(spec.host_bounds)
    chips = _xyz_order(spec.chips_per_host_bounds)
    cx, cy, cz = spec.chips_per_host_bounds
    out: list[dict[str, Any]] = []
    for slice_index in range(num_slices):
        for hx, hy, hz in hosts:
            for x, y, z in chips:
                coords = [hx * cx + x, hy * cy + y, hz * cz + z]
                for core in range(spec.devices_per_chip):
                    # Key order as torch_xla's docs print them (PJRT's attribute map has none
                    # of its own; 'name' is added last).
                    attrs: dict[str, Any]
                    if num_slices > 1:
                        attrs = {"num_cores": 1, "core_on_chip": core, "slice_index": slice_index}
                    else:
                        attrs = {"core_on_chip": core, "num_cores": 1}
                    attrs["coords"] = list(coords)
                    attrs["name"] = f"TPU:{len(out)}"
                    out.append(attrs)
    return out
