"""SPMD logic of the simulator: meshes, partition specs, OpSharding, shards, device layout.

Pure logic lives in ``op_sharding`` (protos, spec strings, shard shapes and indices),
``mesh`` (mesh and partition-spec arithmetic), ``device_mesh`` (HybridMesh's torus mapping)
and ``device_layout`` (TPU device attributes).  ``xlac`` holds the ``torch_xla._XLAC`` SPMD
functions over simulated tensors and ``memory`` the per-chip HBM model.

What the simulator core calls:
  * ``xlac`` names in its ``__all__``: served as ``torch_xla._XLAC`` attributes;
  * ``xlac.place_input`` for every host-to-device transfer of ``_xla_tensors_from_aten``;
  * ``propagation.output_sharding`` for SPMD graph outputs after a sync;
  * ``device_attributes(spec)`` for ``xr.global_runtime_device_attributes()``.
"""

from __future__ import annotations

from xlasim.sharding.device_layout import device_attributes
from xlasim.sharding.op_sharding import OpSharding, ProtoType, ShardingKind
from xlasim.sharding.tensor_sharding import TensorSharding

__all__ = [
    "OpSharding",
    "ProtoType",
    "ShardingKind",
    "TensorSharding",
    "device_attributes",
]
