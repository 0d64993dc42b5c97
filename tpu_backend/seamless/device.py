"""Which device the loop runs on (TPU through TorchTPU or torch_xla -> GPU -> CPU), and moving
data there.

``import tpu_backend.seamless`` never imports torch_xla: importing it selects and starts a
PJRT runtime, so it is imported only once :func:`xla_configured` says an XLA device is meant
to be used. Nor does it import TorchTPU: a process that has loaded it (``import torch_tpu``,
or Ray Train's TPU workers) and has a ``tpu`` device runs the loop there.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils._pytree import tree_map

from tpu_backend import context
from tpu_backend.machine import count_tpu_chips

__all__ = [
    "DeviceInfo",
    "detect_device",
    "device_kind",
    "in_ray_train",
    "move",
    "to_device",
    "torch_tpu_device",
    "xla_configured",
]


@dataclass(frozen=True)
class DeviceInfo:
    """Where the loop runs."""

    kind: str
    """'tpu' (TorchTPU's eager device), 'xla', 'cuda' or 'cpu'."""
    device: Any
    """The ``torch.device`` to put tensors on."""
    spmd: bool = False
    mesh: Any = None
    """The SPMD mesh batches are sharded over (None without SPMD)."""
    in_ray_train: bool = False
    num_processes: int = 1
    """Processes of this job (SPMD: hosts; otherwise ranks)."""
    process_index: int = 0
    num_data_loaders: int = 1
    """Processes that load distinct parts of each global batch: the ranks of CPU/GPU and
    multi-process XLA runs; 1 under SPMD, where every host iterates the same global batch
    and torch_xla transfers each host's addressable shards of it."""


def _simulator_active() -> bool:
    # Peek only: the backend never imports the simulator.
    sim = sys.modules.get("xlasim")
    is_active = getattr(sim, "is_active", None)
    return bool(is_active()) if callable(is_active) else False


def torch_tpu_device() -> Any:
    """This process's TorchTPU device (one per process), where TorchTPU is loaded and finds
    a chip; else None."""
    tpu = getattr(torch, "tpu", None)
    if "torch_tpu" not in sys.modules or tpu is None:
        return None
    if torch._C._get_privateuse1_backend_name() != "tpu" or tpu.device_count() < 1:
        return None
    return torch.device("tpu", tpu.current_device())


def xla_configured() -> bool:
    """Whether this process should use torch_xla: importable and an XLA device configured.

    Configured means: the backend bootstrapped this worker, the simulator is active,
    ``PJRT_DEVICE`` is set, or the host has TPU chips.  Without one of those, importing
    torch_xla would fall back to its CPU client, which is not what a GPU/CPU loop wants.
    """
    if context._state is not None or _simulator_active():
        return True
    if "torch_xla" not in sys.modules:
        # Any finder may answer, the simulator's environment activation included.
        try:
            if importlib.util.find_spec("torch_xla") is None:
                return False
        except (ImportError, ValueError):
            return False
    return bool(os.environ.get("PJRT_DEVICE")) or count_tpu_chips() > 0


def in_ray_train() -> bool:
    if "ray" not in sys.modules:
        return False
    try:
        import ray.train  # deferred: Ray is optional, and loaded already when it matters

        ray.train.get_context().get_world_rank()
    except Exception:  # noqa: BLE001 - any failure means "not inside a training function"
        return False
    return True


def _xla_mesh(spmd: bool, in_ray: bool) -> Any:
    if not spmd:
        return None
    if in_ray:
        mesh = context.get_xla_mesh()
        if mesh is not None:
            return mesh
    # Deferred: torch_xla is imported only once an XLA device is configured.
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    mesh = xs.get_global_mesh()
    if mesh is None:
        n = xr.global_runtime_device_count()
        mesh = xs.Mesh(np.arange(n), (n,), ("data",))
    return mesh


def detect_device() -> DeviceInfo:
    """TPU (TorchTPU where it is loaded, else torch_xla) -> GPU -> CPU, inside or outside a
    Ray Train worker."""
    in_ray = in_ray_train()
    tpu = torch_tpu_device()
    if tpu is None and xla_configured():
        # Deferred: torch_xla is imported only once an XLA device is configured.
        import torch_xla
        import torch_xla.runtime as xr

        spmd = xr.is_spmd()
        if spmd:
            count, index, loaders = xr.process_count(), xr.process_index(), 1
        else:
            count, index = xr.world_size(), xr.global_ordinal()
            loaders = count
        return DeviceInfo(
            kind="xla",
            device=torch_xla.device(),
            spmd=spmd,
            mesh=_xla_mesh(spmd, in_ray),
            in_ray_train=in_ray,
            num_processes=count,
            process_index=index,
            num_data_loaders=loaders,
        )
    distributed = dist.is_available() and dist.is_initialized()
    count = dist.get_world_size() if distributed else 1
    index = dist.get_rank() if distributed else 0
    if tpu is not None:
        device = tpu
    elif in_ray:
        import ray.train.torch  # deferred: Ray is optional

        device = ray.train.torch.get_device()
    elif torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    return DeviceInfo(
        kind=device_kind(device),
        device=device,
        in_ray_train=in_ray,
        num_processes=count,
        process_index=index,
        num_data_loaders=count,
    )


def device_kind(device: Any) -> str:
    """The loop's kind of a non-XLA ``torch.device``: 'tpu', 'cuda', else 'cpu'."""
    return device.type if device.type in ("tpu", "cuda") else "cpu"


def move(value: Any, device: Any) -> Any:
    """``value`` (a tensor or a nested list/tuple/dict of them) with its tensors on ``device``."""

    def one(v: Any) -> Any:
        return v.to(device) if isinstance(v, torch.Tensor) and v.device != device else v

    return tree_map(one, value)


def to_device(*values: Any, device: Any = None) -> Any:
    """Move tensors (or nested lists/tuples/dicts of them) to the detected device.

    One argument returns the moved value, several return a tuple.
    """
    if not values:
        raise TypeError("to_device() needs at least one tensor (or nested structure) to move")
    target = device if device is not None else detect_device().device
    moved = tuple(move(v, target) for v in values)
    return moved[0] if len(moved) == 1 else moved
