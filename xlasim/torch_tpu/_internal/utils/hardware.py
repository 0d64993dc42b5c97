"""The TPU chips TorchTPU finds on the PCI bus: those of the simulated host.

TorchTPU loads only where it finds chips; a simulated TPU VM has its slice's chips per host,
of its generation, with the HBM of the simulator's per-chip model.
"""

from __future__ import annotations

from xlasim.runtime import state
from xlasim.runtime.tpu_device import bound_chip as bound_chip  # the chip a process drives

# TorchTPU's names for the generations it recognises; any other is plain "TPU".
_NAMES = {
    "v4": "TPU v4",
    "v5litepod": "TPU v5e",
    "v5p": "TPU v5p",
    "v6e": "TPU v6e",
    "v7x": "TPU v7",
}


# TorchTPU's topology ("x,y,z" of chips, then cores per chip on v7) of the chips a host's
# processes drive, by generation and process count: a count it does not list has none.
_TOPOLOGIES: dict[str, dict[int, str]] = {
    "v4": {1: "1,1,1", 2: "1,2,1", 4: "2,2,1", 8: "2,2,2"},
    "v5p": {1: "1,1,1", 2: "1,2,1", 4: "2,2,1", 8: "2,2,2"},
    "v5litepod": {1: "1,1,1", 4: "2,2,1", 8: "2,4,1"},
    "v6e": {1: "1,1,1", 4: "2,2,1", 8: "2,4,1"},
    "v7x": {2: "1,1,1,2", 4: "1,2,1,2", 8: "2,2,1,2"},
}


def get_tpu_device_count() -> int:
    """TPU devices on this host's PCI bus: the simulated host's (a chip's cores each where a
    chip exposes several, as v7's two), or none outside a simulation."""
    runtime = state.active()
    return runtime.spec.devices_per_host if runtime is not None else 0


def get_tpu_device_name() -> str:
    runtime = state.active()
    if runtime is None:
        return "TPU"
    return _NAMES.get(runtime.spec.accelerator, "TPU")


def get_tpu_topology(world_size: int | None = None) -> str | None:
    """The topology of ``world_size`` processes on this host (by default, one per chip), as
    TorchTPU names it; None where no TPU is attached."""
    runtime = state.active()
    table = _TOPOLOGIES.get(runtime.spec.accelerator) if runtime is not None else None
    if table is None:
        return None
    count = world_size if world_size is not None else get_tpu_device_count()
    if count not in table:
        raise RuntimeError(f"No TPU topology found for count: {count}")
    return table[count]


def get_hbm_bytes_per_device() -> int | None:
    """HBM one device addresses: a chip's, split between the devices a chip exposes."""
    runtime = state.active()
    if runtime is None or runtime.spec.accelerator not in _NAMES:
        return None
    return runtime.spec.hbm_bytes_per_chip // runtime.spec.devices_per_chip
