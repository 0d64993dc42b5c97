"""The PJRT client a simulated process runs against: its slice's TPU host, or a PJRT CPU client.

torch_xla creates its computation client once, on first use of a device, from
``PJRT_DEVICE``: a simulated process starts as a TPU host of its slice (``PJRT_DEVICE=TPU``, as a
TPU VM selects), and a program that switches to ``CPU`` before the client exists (with the
variable or ``xr.set_device_type('CPU')``) gets what real torch_xla gives it on any machine:
``CPU_NUM_DEVICES`` devices (default 1) named ``CPU:i``, all in this one process.  Once made,
the client never changes for the life of the runtime, whatever the variable says later.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tpu_backend.topology import SliceSpec
from xlasim.runtime.settings import xla_env_int
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
    num_slices: int = 1
    """Slices of ``spec`` joined over DCN: device ids run slice by slice."""

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
            # A process per chip sees the slice's chips (or, alone, its first one).
            return device_attributes(self.spec, self.num_slices)[: self.num_devices]
        return [{"name": f"{self.device_type}:{i}"} for i in range(self.num_devices)]


def tpu_client(
    spec: SliceSpec, host_index: int, num_slices: int = 1, slice_index: int = 0
) -> Client:
    """A TPU host's client.  Across slices, PJRT numbers processes and devices slice by slice
    (torch_xla's global ordinals follow the device ids), so host ``h`` of slice ``s`` is
    process ``s * hosts + h``."""
    per_host = spec.devices_per_host
    process = slice_index * spec.num_hosts + host_index
    return Client(
        TPU,
        spec.num_devices * num_slices,
        process * per_host,
        per_host,
        spec.num_hosts * num_slices,
        process,
        spec.device_kind,
        spec,
        num_slices,
    )


def _bounds_size(name: str, environ: Mapping[str, str]) -> int | None:
    text = (environ.get(name) or "").strip()
    if not text:
        return None
    try:
        dims = [int(part) for part in text.split(",")]
    except ValueError:
        dims = []
    if not dims or any(d < 1 for d in dims):
        raise ValueError(
            f"{name}={text!r} is not valid TPU bounds: expected positive integers joined by "
            "commas, e.g. '2,2,1'"
        )
    return math.prod(dims)


def chip_process_client(
    spec: SliceSpec, host_index: int, environ: Mapping[str, str] = os.environ
) -> Client | None:
    """The client of a process that owns one chip of its host (``TPU_VISIBLE_CHIPS``), as
    ``xmp.spawn`` configures each of its processes; None when the process owns its host.

    libtpu reads the same variables: ``TPU_PROCESS_BOUNDS`` (how many such processes the slice
    has) and ``CLOUD_TPU_TASK_ID`` (this one's index), with one chip per process
    (``TPU_CHIPS_PER_PROCESS_BOUNDS=1,1,1``).  A process's devices are its chip's cores.
    """
    visible = (environ.get("TPU_VISIBLE_CHIPS") or "").strip()
    every_chip = ",".join(str(c) for c in range(spec.chips_per_host))
    if not visible or (visible.replace(" ", "") == every_chip and spec.chips_per_host > 1):
        return None  # the whole host (what Ray sets for a worker holding every chip)
    per_process = _bounds_size("TPU_CHIPS_PER_PROCESS_BOUNDS", environ)
    if not visible.isdigit() or per_process not in (None, 1):
        raise NotImplementedError(
            f"xlasim simulates processes that own one chip of their host (TPU_VISIBLE_CHIPS "
            f"set to one chip index, TPU_CHIPS_PER_PROCESS_BOUNDS=1,1,1), not "
            f"TPU_VISIBLE_CHIPS={visible!r} with TPU_CHIPS_PER_PROCESS_BOUNDS="
            f"{environ.get('TPU_CHIPS_PER_PROCESS_BOUNDS')!r}"
        )
    chip = int(visible)
    if chip >= spec.chips_per_host:
        raise ValueError(
            f"TPU_VISIBLE_CHIPS={visible!r}: a host of {spec.pod_type} has chips "
            f"0..{spec.chips_per_host - 1}"
        )
    processes = _bounds_size("TPU_PROCESS_BOUNDS", environ) or spec.num_chips
    task = xla_env_int("CLOUD_TPU_TASK_ID", host_index * spec.chips_per_host + chip, environ)
    if not 0 <= task < processes:
        raise ValueError(
            f"CLOUD_TPU_TASK_ID={task} is outside the {processes} processes that "
            f"TPU_PROCESS_BOUNDS={environ.get('TPU_PROCESS_BOUNDS')!r} describes"
        )
    per_chip = spec.devices_per_chip
    return Client(
        TPU,
        processes * per_chip,
        task * per_chip,
        per_chip,
        processes,
        task,
        spec.device_kind,
        spec,
    )


def cpu_client(num_devices: int) -> Client:
    return Client(CPU, num_devices, 0, num_devices, 1, 0, "cpu")


def client_from_env(
    spec: SliceSpec,
    host_index: int,
    environ: Mapping[str, str] = os.environ,
    num_slices: int = 1,
    slice_index: int = 0,
) -> Client:
    """The client torch_xla would create now, from ``PJRT_DEVICE`` (and ``CPU_NUM_DEVICES``)."""
    device = environ.get("PJRT_DEVICE")
    if not device:
        raise RuntimeError("$PJRT_DEVICE is not set.")
    if device == TPU:
        if num_slices > 1:
            if chip_process_client(spec, host_index, environ) is not None:
                raise NotImplementedError(
                    "xlasim simulates multislice runs with one process per host (SPMD), not "
                    "processes that own one chip (TPU_VISIBLE_CHIPS) across slices"
                )
            return tpu_client(spec, host_index, num_slices, slice_index)
        return chip_process_client(spec, host_index, environ) or tpu_client(spec, host_index)
    if device == CPU:
        count = xla_env_int("CPU_NUM_DEVICES", 1, environ)
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
