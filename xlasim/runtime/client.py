"""The PJRT client a simulated process runs against: its slice's TPU host, or a PJRT CPU client.

torch_xla creates its computation client once, on first use of a device, from
``PJRT_DEVICE``: a simulated process starts as a TPU host of its slice (``PJRT_DEVICE=TPU``, as a
TPU VM selects), and a program that switches to ``CPU`` before the client exists (with the
variable or ``xr.set_device_type('CPU')``) gets what real torch_xla gives it on any machine:
``CPU_NUM_DEVICES`` devices (default 1) named ``CPU:i``, all in this one process.  Once made,
the client never changes for the life of the runtime, whatever the variable says later.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tpu_backend.topology import SliceSpec
from xlasim.runtime.sysenv import env_int
from xlasim.sharding.device_layout import device_attributes

TPU = "TPU"
CPU = "CPU"

# PJRT device types real torch_xla knows but the simulator does not stand for.
_NOT_SIMULATED = ("CUDA", "GPU", "ROCM", "NEURON", "XPU")


@dataclass(frozen=True)
class Client:
    """What one process's PJRT client reports: its devices and its place among processes."""

    device_type: str
    num_devices: int
    """Devices of every process (global ids ``0 .. num_devices - 1``)."""
    first_local: int
    """Global id of this process's first device; its devices are consecutive."""
    num_local: int
    num_processes: int
    process_index: int
    device_kind: str
    spec: SliceSpec | None = None
    """The TPU slice (None for the CPU client)."""

    @property
    def is_tpu(self) -> bool:
        return self.device_type == TPU

    def global_ids(self) -> list[int]:
        return list(range(self.num_devices))

    def local_ids(self) -> list[int]:
        return list(range(self.first_local, self.first_local + self.num_local))

    def attributes(self) -> list[dict[str, Any]]:
        """``xr.global_runtime_device_attributes()``: TPU devices say where they sit on the
        slice; CPU devices report their name only."""
        if self.spec is not None:
            return device_attributes(self.spec)
        return [{"name": f"{self.device_type}:{i}"} for i in range(self.num_devices)]


def tpu_client(spec: SliceSpec, host_index: int) -> Client:
    per_host = spec.devices_per_host
    return Client(
        TPU,
        spec.num_devices,
        host_index * per_host,
        per_host,
        spec.num_hosts,
        host_index,
        spec.device_kind,
        spec,
    )


def cpu_client(num_devices: int) -> Client:
    return Client(CPU, num_devices, 0, num_devices, 1, 0, "cpu")


def client_from_env(
    spec: SliceSpec, host_index: int, environ: Mapping[str, str] = os.environ
) -> Client:
    """The client torch_xla would create now, from ``PJRT_DEVICE`` (and ``CPU_NUM_DEVICES``)."""
    device = environ.get("PJRT_DEVICE")
    if not device:
        raise RuntimeError("$PJRT_DEVICE is not set.")
    if device == TPU:
        return tpu_client(spec, host_index)
    if device == CPU:
        count = env_int("CPU_NUM_DEVICES", 1, environ)
        if count < 1:
            raise ValueError(
                f"CPU_NUM_DEVICES={environ.get('CPU_NUM_DEVICES')!r} is not a valid number of "
                "PJRT CPU devices: expected a positive integer"
            )
        return cpu_client(count)
    if device.upper().split("_")[0] in _NOT_SIMULATED + (TPU, CPU):
        raise NotImplementedError(
            f"xlasim simulates the PJRT TPU client of its slice and the PJRT CPU client; "
            f"PJRT_DEVICE={device!r} is not simulated"
        )
    raise RuntimeError(
        f"No PjRtPlugin registered for: {device}. Make sure the environment variable "
        "PJRT_DEVICE is set to a correct device name. See "
        "https://github.com/pytorch/xla/blob/master/docs/source/contribute/plugins.md for more "
        "information on implementing and registering a new plugin."
    )
