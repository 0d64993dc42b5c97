"""The TPU chips TorchTPU finds on the PCI bus: those of the simulated host.

TorchTPU loads only where it finds chips; a simulated TPU VM has its slice's chips per host,
of its generation, with the HBM of the simulator's per-chip model.
"""

from __future__ import annotations

import os

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


def bound_chip() -> int:
    """The chip of this host that the process's one ``tpu`` device is.

    Launchers that run one process per chip (Ray for a worker holding ``{"TPU": 1}``,
    TorchTPU's own launch environment) make only that chip visible to it through
    ``TPU_VISIBLE_CHIPS``; where it names several (or none: every chip is visible), the
    device is the first one visible.
    """
    runtime = state.active()
    if runtime is None:
        raise RuntimeError("no simulated TPU is attached: there is no chip to bind")
    chips = runtime.spec.chips_per_host
    visible = (os.environ.get("TPU_VISIBLE_CHIPS") or "").replace(" ", "")
    if not visible:
        return 0
    first = visible.split(",")[0]
    if not first.isdigit() or int(first) >= chips:
        raise ValueError(
            f"TPU_VISIBLE_CHIPS={visible!r}: a host of {runtime.spec.pod_type} has chips "
            f"0..{chips - 1}"
        )
    return int(first)
