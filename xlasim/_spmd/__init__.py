"""SPMD logic of the simulator: meshes, partition specs, OpSharding, shards, device layout.

Pure logic lives in ``op_sharding`` (protos, spec strings, shard shapes and indices),
``mesh`` (mesh and partition-spec arithmetic), ``device_mesh`` (HybridMesh's torus mapping)
and ``device_layout`` (TPU device attributes).  ``xlac`` holds the ``torch_xla._XLAC`` SPMD
functions over simulated tensors and ``memory`` the per-chip HBM model.

Hooks the simulator core calls:
  * ``sharding_spec_string(t)`` for ``torch_xla._XLAC._get_xla_sharding_spec``;
  * ``device_attributes(spec)`` for ``xr.global_runtime_device_attributes()``.
"""

from __future__ import annotations

from typing import Any

from xlasim._spmd.device_layout import device_attributes
from xlasim._spmd.op_sharding import OpSharding, ProtoType, ShardingKind
from xlasim._spmd.tensor_sharding import TensorSharding

__all__ = [
    "OpSharding",
    "ProtoType",
    "ShardingKind",
    "TensorSharding",
    "device_attributes",
    "sharding_spec_string",
]


def sharding_spec_string(t: Any) -> str:
    """``torch_xla._XLAC._get_xla_sharding_spec(t)``."""
    from xlasim._spmd.xlac import _get_xla_sharding_spec

    return _get_xla_sharding_spec(t)
