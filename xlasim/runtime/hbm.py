"""Per-chip HBM of one simulated runtime: running totals of the live device buffers.

A *buffer* is what a device holds for one tensor value: created when data reaches the
devices (a host-to-device transfer, a factory such as ``torch.zeros(..., device=xla)``, a
device-to-device copy) or when a sync materializes a computed value (parameters after an
optimizer step, gradients, optimizer state, graph outputs), and freed when the last tensor
holding it dies.  Tensors that share a value (``detach()``) share its buffer.  Each buffer
occupies, on every device that holds a piece of it:

* unsharded under SPMD, or replicated: the whole tensor (torch_xla replicates unannotated
  data over every device);
* unsharded without SPMD: the whole tensor, on its own device only;
* tiled / partially replicated: one shard of the padded shard shape
  (``ShardingUtil::GetShardShape``: every dimension rounded up to a multiple of its tiles),
  on each device of the tile assignment.

A chip holds the sum over its devices (2 per chip on v2/v3/v7x).  The totals change where
buffers are made, resharded and freed, so asking "does it fit" costs the same whatever the
number of live tensors; per-device arithmetic happens only for buffers that live on some of
the devices (non-SPMD tensors, meshes over part of the slice).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tpu_backend.topology import SliceSpec
from xlasim.runtime.dynamic_dims import bounds
from xlasim.runtime.settings import ENFORCE_HBM_ENV, env_bool
from xlasim.sharding.device_layout import device_attributes
from xlasim.sharding.op_sharding import ProtoType
from xlasim.sharding.tensor_sharding import TensorSharding

ENFORCE_ENV = ENFORCE_HBM_ENV

Devices = tuple[int, ...] | None
"""Which devices hold a buffer: None for every device of the slice."""


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


def layout(
    shape: tuple[int, ...],
    itemsize: int,
    sharding: TensorSharding | None,
    device_index: int,
    spmd: bool,
    num_devices: int,
) -> tuple[Devices, int]:
    """(devices holding it, bytes on each of them) for one tensor value."""
    full = itemsize
    for d in shape:
        full *= d
    if sharding is None:
        return (None, full) if spmd else ((device_index,), full)
    op = sharding.op
    kind = op.proto_type
    if kind in (ProtoType.REPLICATED, ProtoType.UNKNOWN, ProtoType.MANUAL):
        return None, full
    held = op.tile_assignment_devices
    devices: Devices = None if len(held) == num_devices else tuple(sorted(set(held)))
    if kind == ProtoType.MAXIMAL:
        return devices, full
    nbytes = itemsize
    for d in sharding.shard_shape():
        nbytes *= d
    return devices, nbytes


class HBM:
    """The live buffers of one runtime, as totals per device."""

    __slots__ = (
        "spec",
        "num_slices",
        "num_chips",
        "num_devices",
        "on_chips",
        "enforce",
        "every",
        "extra",
        "_fullest_extra",
        "peak_bytes",
    )

    def __init__(self, spec: SliceSpec, num_slices: int = 1) -> None:
        self.spec = spec
        self.num_slices = num_slices
        # Every slice's chips, each with its own HBM: device ids run slice by slice.
        self.num_chips = spec.num_chips * num_slices
        self.num_devices = spec.num_devices * num_slices
        """Devices of the process's PJRT client (every process's)."""
        self.on_chips = True
        """Whether the devices are the slice's chips (False: PJRT CPU devices, host memory)."""
        self.enforce: bool | None = None
        """Whether an overflow fails; None until first asked (``XLASIM_ENFORCE_HBM``)."""
        self.every = 0
        """Bytes held on every device (replicated and evenly sharded buffers)."""
        self.extra: list[int] | None = None
        """Bytes held on some devices only, per device (allocated on first use)."""
        self._fullest_extra: tuple[int, int] | None = None
        """(chip, its sum of ``extra``) for the chip with the most (None: to recompute)."""
        self.peak_bytes: dict[int, int] = {}
        """Highest bytes in use seen per device ordinal, as ``xm.get_memory_info`` reports it."""

    # -- totals ------------------------------------------------------------------------------
    def add(self, devices: Devices, nbytes: int) -> None:
        if devices is None:
            self.every += nbytes
            return
        extra = self.extra
        if extra is None:
            extra = self.extra = [0] * self.num_devices
        for d in devices:
            extra[d] += nbytes
        self._fullest_extra = None

    def device_bytes(self) -> list[int]:
        if self.extra is None:
            return [self.every] * self.num_devices
        return [self.every + e for e in self.extra]

    def chip_bytes(self) -> list[int]:
        k = self.spec.devices_per_chip
        per_device = self.device_bytes()
        return [sum(per_device[c * k : (c + 1) * k]) for c in range(self.num_chips)]

    def _chip_extra(self, chip: int) -> int:
        if self.extra is None:
            return 0
        k = self.spec.devices_per_chip
        return sum(self.extra[chip * k : (chip + 1) * k])

    def _fullest_chip(self) -> tuple[int, int]:
        """(chip, bytes it holds) of the fullest chip (the first one among equals)."""
        k = self.spec.devices_per_chip
        if self.extra is None:
            return 0, self.every * k
        if self._fullest_extra is None:
            sums = [self._chip_extra(c) for c in range(self.num_chips)]
            best = max(sums)
            self._fullest_extra = (sums.index(best), best)
        chip, extra = self._fullest_extra
        return chip, self.every * k + extra

    def host_memory(self, num_devices: int) -> None:
        """The client's devices are PJRT CPU devices: counted per device, never refused (host
        memory has no per-chip HBM bound)."""
        self.num_devices = num_devices
        self.on_chips = False

    # -- the out-of-memory check ----------------------------------------------------------------
    def enforcing(self) -> bool:
        if not self.on_chips:
            return False
        if self.enforce is None:
            # Read at first use, so a program may set the variable after entering the simulation.
            self.enforce = env_bool(ENFORCE_ENV)
        return self.enforce

    def check(
        self, devices: Devices, nbytes: int, freed: tuple[Devices, int] | None = None
    ) -> None:
        """Fails like PJRT's allocator if ``nbytes`` more on ``devices`` overflow a chip.

        ``freed`` is a buffer the new one replaces (a reshard): it no longer counts.
        """
        if not self.enforcing():
            return
        spec = self.spec
        k = spec.devices_per_chip
        capacity = spec.hbm_bytes_per_chip
        if devices is None:
            chip, used = self._fullest_chip()
            touched = [(chip, used, nbytes * k)]
        else:
            per_chip: dict[int, int] = {}
            for d in devices:
                per_chip[d // k] = per_chip.get(d // k, 0) + nbytes
            touched = [
                (c, self.every * k + self._chip_extra(c), need) for c, need in per_chip.items()
            ]
        for chip, used, need in touched:
            if freed is not None:
                old_devices, old_bytes = freed
                if old_devices is None:
                    used -= old_bytes * k
                else:
                    used -= old_bytes * sum(1 for d in old_devices if d // k == chip)
            if used + need > capacity:
                raise RuntimeError(
                    "Bad StatusOr access: RESOURCE_EXHAUSTED: Error allocating device buffer: "
                    f"Attempting to allocate {human_bytes(need)}. That was not possible. There "
                    f"are {human_bytes(max(capacity - used, 0))} free.; "
                    f"({self._hbm_name(chip * k)})"
                )

    def _hbm_name(self, device: int) -> str:
        attrs = device_attributes(self.spec, self.num_slices)[device]
        x, y, z = attrs["coords"]
        return f"{x}x{y}x{z}_HBM{attrs['core_on_chip']}"


class Buffer:
    """One device buffer: counted in its runtime's totals while any tensor holds it."""

    __slots__ = ("hbm", "devices", "nbytes", "key", "cleared")

    def __init__(self, hbm: HBM, devices: Devices, nbytes: int, key: Any) -> None:
        self.hbm = hbm
        self.devices = devices
        self.nbytes = nbytes
        self.key = key
        """What the layout was computed from: a tensor whose key differs needs a new one."""
        self.cleared = False
        """Stands for a value whose pending IR was dropped (``_clear_pending_irs``): no data."""
        hbm.add(devices, nbytes)

    def __del__(self) -> None:
        self.hbm.add(self.devices, -self.nbytes)


def layout_of(t: Any, spmd: bool, num_devices: int) -> tuple[Devices, int]:
    """:func:`layout` of simulated device tensor ``t`` as it is now."""
    return layout(
        bounds(t.shape), t.dtype.itemsize, t._sharding, t._device.index or 0, spmd, num_devices
    )


def _key(t: Any, spmd: bool) -> tuple[Any, ...]:
    """What a tensor's buffer layout depends on."""
    return (bounds(t.shape), t.dtype, t._sharding, spmd, t._device.index)


def _marked(buf: Buffer) -> bool:
    """A buffer standing for dropped IR: a new value in it is a new buffer."""
    return buf.cleared


def settle(hbm: HBM, spmd: bool, t: Any) -> None:
    """Gives device tensor ``t`` the buffer its data occupies now (checked when enforcing).

    Cheap when nothing changed (same shape, dtype, sharding and mode as its buffer's).
    """
    key = _key(t, spmd)
    old = t._buf
    if old is not None and old.key == key and not _marked(old):
        return
    devices, nbytes = layout_of(t, spmd, hbm.num_devices)
    hbm.check(devices, nbytes, None if old is None else (old.devices, old.nbytes))
    t._buf = Buffer(hbm, devices, nbytes, key)


def settle_all(hbm: HBM, spmd: bool, tensors: Sequence[Any]) -> None:
    """:func:`settle` for the values one sync materializes, checked together (XLA allocates
    a program's outputs for one execution): if they do not fit, none gets a buffer."""
    made: list[tuple[Any, Buffer]] = []
    replaced: list[Buffer] = []
    try:
        for t in tensors:
            key = _key(t, spmd)
            old = t._buf
            if old is not None:
                if old.key == key and not _marked(old):
                    continue
                # The value it replaces is released by the same execution.
                hbm.add(old.devices, -old.nbytes)
                replaced.append(old)
            devices, nbytes = layout_of(t, spmd, hbm.num_devices)
            hbm.check(devices, nbytes)
            made.append((t, Buffer(hbm, devices, nbytes, key)))
    finally:
        for old in replaced:
            hbm.add(old.devices, old.nbytes)
    # Assigning drops the replaced buffers (released unless another tensor shares them).
    for t, buf in made:
        t._buf = buf
