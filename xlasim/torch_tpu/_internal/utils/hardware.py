"""The TPU chips TorchTPU finds on the PCI bus: those of the simulated host.

TorchTPU loads only where it finds chips; a simulated TPU VM has its slice's chips per host,
of its generation, with the HBM of the simulator's per-chip model.
"""

from __future__ import annotations

from xlasim.runtime import state

# TorchTPU's names for the generations it recognises; any other is plain "TPU".
_NAMES = {
    "v4": "TPU v4",
    "v5litepod": "TPU v5e",
    "v5p": "TPU v5p",
    "v6e": "TPU v6e",
    "v7x": "TPU v7",
}


def get_tpu_device_count() -> int:
    """Chips on this host's PCI bus: the simulated host's, or none outside a simulation."""
    runtime = state.active()
    return runtime.spec.chips_per_host if runtime is not None else 0


def get_tpu_device_name() -> str:
    runtime = state.active()
    if runtime is None:
        return "TPU"
    return _NAMES.get(runtime.spec.accelerator, "TPU")


def get_hbm_bytes_per_device() -> int | None:
    """HBM one device addresses: a chip's, split between the devices a chip exposes."""
    runtime = state.active()
    if runtime is None or runtime.spec.accelerator not in _NAMES:
        return None
    return runtime.spec.hbm_bytes_per_chip // runtime.spec.devices_per_chip
