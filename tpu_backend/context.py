"""Per-worker state the backend leaves for the training function.

Ray Train's context has no slot for backend state, so the bootstrap (run on each worker
actor's main thread) stores it in this module; the training function runs in another
thread of the same process and reads it through :func:`get_xla_mesh` and friends.
Only stdlib is imported here: ``import tpu_backend`` stays cheap.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

__all__ = ["XlaWorkerState", "get_xla_mesh", "is_xla_backend", "get_xla_worker_state"]


@dataclass(frozen=True)
class XlaWorkerState:
    """What the bootstrap established on this worker."""

    spmd: bool
    host_index: int
    """TPU worker id of this host (= ``xr.process_index()`` under SPMD)."""
    num_hosts: int
    process_index: int
    process_count: int
    global_device_count: int
    mesh: Any
    """The ``torch_xla.distributed.spmd.Mesh`` (None without SPMD)."""
    mesh_shape: tuple[int, ...] | None
    axis_names: tuple[str, ...] | None
    slice_topology: str | None
    slice_accelerator: str | None
    pod_type: str | None
    process_group_backend: str
    device_type: str
    """``xr.device_type()``: 'TPU' on TPU and on the simulator, 'CPU' on PJRT CPU."""
    num_slices: int = 1
    """Slices joined over DCN in the run (a multislice job); ``host_index`` is per slice."""
    slice_index: int = 0


_lock = threading.Lock()
_state: XlaWorkerState | None = None


def _set_state(state: XlaWorkerState | None) -> None:
    global _state
    with _lock:
        _state = state


def _require_train_context(api: str) -> None:
    try:
        import ray.train  # deferred: Ray is optional, and import tpu_backend stays light
    except ImportError as e:  # pragma: no cover - ray is a dependency of the backend extra
        raise RuntimeError(
            f"tpu_backend.{api}() must be called inside a Ray Train training function, and "
            f"ray[train] is not installed"
        ) from e
    try:
        ray.train.get_context()
    except RuntimeError as e:
        raise RuntimeError(
            f"tpu_backend.{api}() must be called inside a Ray Train training function (the "
            f"train_loop_per_worker of a TorchTrainer); it was called outside one"
        ) from e


def get_xla_worker_state() -> XlaWorkerState | None:
    """The bootstrap's record on this worker; None when the run is not on the XLA backend.

    Raises ``RuntimeError`` outside a Ray Train training function.
    """
    _require_train_context("get_xla_worker_state")
    return _state


def get_xla_mesh() -> Any:
    """The SPMD mesh the backend built for this run (a ``torch_xla.distributed.spmd.Mesh``).

    ``None`` when the run does not use the XLA backend or runs without SPMD.  Raises
    ``RuntimeError`` outside a Ray Train training function.
    """
    _require_train_context("get_xla_mesh")
    return _state.mesh if _state is not None else None


def is_xla_backend() -> bool:
    """Whether this training function runs on the XLA backend.

    Raises ``RuntimeError`` outside a Ray Train training function.
    """
    _require_train_context("is_xla_backend")
    return _state is not None
