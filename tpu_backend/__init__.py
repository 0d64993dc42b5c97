"""Ray Train backend for torch_xla SPMD on TPU slices.

Kept import-light on purpose: importing ``tpu_backend`` must not pull in torch,
torch_xla or ray (the simulator and CLI import the topology model from here).  The Ray
parts (``TorchTrainer``, ``TPUTorchConfig``, ``TPUXLABackend``) load on first access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpu_backend._lazy import lazy_getattr
from tpu_backend.context import get_xla_mesh, get_xla_worker_state, is_xla_backend
from tpu_backend.topology import (
    DEFAULT_ACCELERATOR,
    SliceSpec,
    default_mesh,
    parse_slice,
    tpu_host_env,
)

if TYPE_CHECKING:
    from tpu_backend.config import TPUTorchConfig, TPUXLABackend
    from tpu_backend.trainer import TorchTrainer

# name -> module holding it; imported on first attribute access (they import ray/torch).
_LAZY = {
    "TorchTrainer": "tpu_backend.trainer",
    "TPUTorchConfig": "tpu_backend.config",
    "TPUXLABackend": "tpu_backend.config",
    "SeamlessTPUTrainer": "tpu_backend.seamless",
    "detect_device": "tpu_backend.seamless",
    "to_device": "tpu_backend.seamless",
    "SeamlessConfig": "tpu_backend.precision",
    "CompileCacheStats": "tpu_backend.compile_cache",
    "compile_stats": "tpu_backend.compile_cache",
}

__all__ = [
    "CompileCacheStats",
    "DEFAULT_ACCELERATOR",
    "SeamlessConfig",
    "SeamlessTPUTrainer",
    "SliceSpec",
    "TPUTorchConfig",
    "TPUXLABackend",
    "TorchTrainer",
    "compile_stats",
    "default_mesh",
    "detect_device",
    "get_xla_mesh",
    "get_xla_worker_state",
    "is_xla_backend",
    "parse_slice",
    "to_device",
    "tpu_host_env",
]


__getattr__ = lazy_getattr(__name__, _LAZY, globals())
