"""The sharding annotation a simulated device tensor carries (``XlaSimTensor._sharding``).

It is torch_xla's ``XLATensor::ShardingSpec``: an :class:`OpSharding` plus the global shape it
was made for (and the ``minibatch`` flag the input loader uses).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from xlasim.sharding.op_sharding import OpSharding, ProtoType, replica_and_indices, shard_shape


class TensorSharding:
    __slots__ = ("op", "shape", "minibatch")

    def __init__(self, op: OpSharding, shape: Sequence[int], minibatch: bool = False) -> None:
        self.op = op
        self.shape = tuple(map(int, shape))
        self.minibatch = bool(minibatch)

    def spec_string(self) -> str:
        return self.op.to_string()

    def sharding_type(self) -> int:
        return self.op.sharding_type()

    def same_as(self, other: TensorSharding) -> bool:
        return self.op.same_as(other.op)

    @property
    def is_replicated(self) -> bool:
        return self.op.proto_type in (ProtoType.REPLICATED, ProtoType.UNKNOWN)

    @property
    def is_manual(self) -> bool:
        return self.op.proto_type == ProtoType.MANUAL

    def shard_shape(self) -> list[int]:
        return shard_shape(self.op, self.shape)

    def replica_and_indices(self, device_ordinals: Sequence[int]) -> list[tuple[int, Any]]:
        return replica_and_indices(self.op, self.shape, device_ordinals)

    def devices(self) -> list[int]:
        """Global ordinals that hold a piece of the tensor (all of them unless tiled)."""
        return sorted(set(self.op.tile_assignment_devices))

    def __repr__(self) -> str:
        return f"TensorSharding({self.spec_string()!r}, shape={self.shape})"
