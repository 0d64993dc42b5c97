"""XLA ``OpSharding`` protos and ``HloSharding`` rules, as torch_xla 2.9's C++ applies them.

torch_xla turns the Python mesh arithmetic into an ``xla::OpSharding`` proto
(``ShardingUtil::CreateOpSharding``) and prints it through ``xla::HloSharding``
(``GetXLAShardingSpec``).  The normalisations HloSharding applies on the way are what users
see in spec strings, so they are reproduced here rule for rule:

* ``PartialTile`` collapses to ``{replicated}`` when one group holds every device, drops a
  trailing replication dimension of size 1 (plain tiling), and sorts the devices inside each
  replication group (which is what decides replica ids).
* ``REPLICATED`` and ``MAXIMAL`` (single device) both become ``Replicate()``.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum
from typing import Any

import numpy as np
import torch

from xlasim.sharding.messages import torch_xla_error


class ProtoType(IntEnum):
    """``xla::OpSharding::Type`` (xla_data.proto)."""

    REPLICATED = 0
    MAXIMAL = 1
    TUPLE = 2
    OTHER = 3
    MANUAL = 4
    UNKNOWN = 5


class ShardingType(IntEnum):
    """torch_xla's ``ShardingUtil::ShardingType``, also the public ``xs.ShardingType``."""

    REPLICATED = 0
    MAXIMAL = 1
    TUPLE = 2
    TILED = 3
    MANUAL = 4
    PARTIAL = 5
    UNKNOWN = 6


class OpSharding:
    """An ``xla::OpSharding`` proto, built from the lists the Python mesh code produces.

    The simulated ``torch_xla._XLAC.OpSharding`` is this class plus the runtime's counter.
    Like the pybind class it exposes no fields to users; equality is identity (pybind's
    default).  Internally the proto fields are kept for the spec string and shard layout.
    """

    __slots__ = ("_type", "_dims", "_devices", "_last_tile_dim_replicate")

    def __init__(
        self,
        tile_assignment: list[Any],
        group_assignment: list[Any],
        replication_groups: list[Any],
        sharding_type: int,
    ) -> None:
        _check_constructor_lists(
            tile_assignment, group_assignment, replication_groups, sharding_type
        )
        self._on_create()
        fields = create_op_sharding_fields(
            tile_assignment, group_assignment, replication_groups, int(sharding_type)
        )
        self._type, self._dims, self._devices, self._last_tile_dim_replicate = fields

    def _on_create(self) -> None:
        """Runs for each OpSharding the constructor makes (the simulated surface counts it)."""

    @classmethod
    def from_fields(
        cls,
        proto_type: ProtoType,
        dims: Sequence[int] = (),
        devices: Sequence[int] = (),
        last_tile_dim_replicate: bool = False,
    ) -> OpSharding:
        self = object.__new__(cls)
        self._type = ProtoType(proto_type)
        self._dims = tuple(map(int, dims))
        self._devices = tuple(map(int, devices))
        self._last_tile_dim_replicate = bool(last_tile_dim_replicate)
        return self

    @classmethod
    def replicated(cls) -> OpSharding:
        return cls.from_fields(ProtoType.REPLICATED)

    @classmethod
    def manual(cls) -> OpSharding:
        return cls.from_fields(ProtoType.MANUAL)

    # -- proto fields --------------------------------------------------------------------
    @property
    def proto_type(self) -> ProtoType:
        return self._type

    @property
    def tile_assignment_dimensions(self) -> tuple[int, ...]:
        return self._dims

    @property
    def tile_assignment_devices(self) -> tuple[int, ...]:
        return self._devices

    @property
    def replicate_on_last_tile_dim(self) -> bool:
        return self._last_tile_dim_replicate

    def same_as(self, other: OpSharding) -> bool:
        """``protobuf_util::HaveSameSerialization``."""
        return (
            self._type == other._type
            and self._dims == other._dims
            and self._devices == other._devices
            and self._last_tile_dim_replicate == other._last_tile_dim_replicate
        )

    # -- views ---------------------------------------------------------------------------
    def sharding_type(self) -> int:
        """``ShardingUtil::GetShardingType``."""
        if self._type == ProtoType.OTHER:
            return int(
                ShardingType.PARTIAL if self._last_tile_dim_replicate else ShardingType.TILED
            )
        return {
            ProtoType.REPLICATED: ShardingType.REPLICATED,
            ProtoType.MAXIMAL: ShardingType.MAXIMAL,
            ProtoType.TUPLE: ShardingType.TUPLE,
            ProtoType.MANUAL: ShardingType.MANUAL,
            ProtoType.UNKNOWN: ShardingType.UNKNOWN,
        }[self._type].value

    def to_string(self) -> str:
        """``xla::HloSharding::FromProto(proto)->ToString()``."""
        if self._type == ProtoType.REPLICATED:
            return "{replicated}"
        if self._type == ProtoType.MANUAL:
            return "{manual}"
        if self._type == ProtoType.UNKNOWN:
            return "{unknown}"
        if self._type == ProtoType.MAXIMAL:
            return f"{{maximal device={self._devices[0]}}}"
        text = (
            "devices=[" + ",".join(map(str, self._dims)) + "]" + ",".join(map(str, self._devices))
        )
        suffix = " last_tile_dim_replicate" if self._last_tile_dim_replicate else ""
        return "{" + text + suffix + "}"

    def debug_string(self) -> str:
        """``OpSharding::DebugString()`` as it appears in torch_xla error messages (proto3:
        default-valued fields are omitted; protobuf prefixes a marker line)."""
        lines = ["goo.gle/debugproto   "]
        if self._type != ProtoType.REPLICATED:
            lines.append(f"type: {self._type.name}")
        lines += [f"tile_assignment_dimensions: {d}" for d in self._dims]
        lines += [f"tile_assignment_devices: {d}" for d in self._devices]
        if self._last_tile_dim_replicate:
            lines.append("replicate_on_last_tile_dim: true")
        return "\n".join(lines) + "\n"

    def __repr__(self) -> str:
        return f"<_XLAC.OpSharding object at {hex(id(self))}>"


def _check_constructor_lists(
    tile_assignment: Any, group_assignment: Any, replication_groups: Any, sharding_type: Any
) -> None:
    """The pybind argument check of ``OpSharding(list, list, list, int)``."""
    given = (tile_assignment, group_assignment, replication_groups, sharding_type)
    for name, value in zip(
        ("tile_assignment", "group_assignment", "replication_groups"), given, strict=False
    ):
        if not isinstance(value, list):
            # pybind11's words: the overloads it knows, then every argument's repr.
            raise torch_xla_error(
                TypeError,
                "__init__(): incompatible constructor arguments. The following argument "
                "types are supported:\n    1. _XLAC.OpSharding(arg0: list, arg1: list, "
                "arg2: list, arg3: typing.SupportsInt)\n\nInvoked with: "
                + ", ".join(map(repr, given)),
                f"{name} is a {type(value).__name__}, not a list",
            )


def check_failed(condition: str, message: str) -> RuntimeError:
    """The error a failed ``XLA_CHECK`` surfaces as in Python: a plain RuntimeError."""
    return RuntimeError(f"Check failed: {condition}: {message}")


_MAX_TILE_RANK = 5


def _tile_list_dims(tile_assignment: list[Any]) -> list[int]:
    """``TileAssignmentDimensions``: the nested-list shape, following first elements."""
    dims: list[int] = []
    r: Any = tile_assignment
    while True:
        if len(r) == 0:
            raise check_failed(
                "r.size() > 0", "Invalid argument: empty list is not a valid element type."
            )
        dims.append(len(r))
        if isinstance(r[0], list):
            r = r[0]
        else:
            break
    return dims


def _tile_list_to_array(tile_assignment: list[Any]) -> np.ndarray:
    dims = _tile_list_dims(tile_assignment)
    if len(dims) > _MAX_TILE_RANK:
        # torch_xla logs "tile_assignment ranks > 5" and leaves the array zero-filled, which
        # yields a meaningless sharding; refusing is the honest simulation.
        raise NotImplementedError(
            f"tile assignments of rank {len(dims)} (> {_MAX_TILE_RANK}): torch_xla 2.9 "
            "does not build them (TileListToArray logs an error and returns zeros)"
        )
    return np.asarray(tile_assignment, dtype=np.int64).reshape(dims)


def _partial_tile(tile: np.ndarray) -> tuple[ProtoType, tuple[int, ...], tuple[int, ...], bool]:
    """``xla::HloSharding::PartialTile(tile_assignment_last_dim_replicate)``."""
    if tile.ndim == 1 or tile.shape[-1] == tile.size:
        return ProtoType.REPLICATED, (), (), False
    if tile.shape[-1] == 1:
        return ProtoType.OTHER, tile.shape[:-1], tuple(tile.flatten().tolist()), False
    group_size = tile.shape[-1]
    groups = tile.reshape(-1, group_size)
    sorted_tile = np.sort(groups, axis=1).reshape(tile.shape)
    return ProtoType.OTHER, tile.shape, tuple(sorted_tile.flatten().tolist()), True


def create_op_sharding_fields(
    tile_assignment: list[Any],
    group_assignment: list[Any],
    replication_groups: list[Any],
    sharding_type: int,
) -> tuple[ProtoType, tuple[int, ...], tuple[int, ...], bool]:
    """``ShardingUtil::CreateOpSharding``."""
    if sharding_type == ShardingType.MANUAL:
        return ProtoType.MANUAL, (), (), False
    if sharding_type in (ShardingType.MAXIMAL, ShardingType.REPLICATED):
        return ProtoType.REPLICATED, (), (), False
    if sharding_type == ShardingType.TILED:
        tile = _tile_list_to_array(tile_assignment)
        return ProtoType.OTHER, tile.shape, tuple(tile.flatten().tolist()), False
    if sharding_type == ShardingType.PARTIAL:
        if len(replication_groups) == 0:
            raise check_failed(
                "replication_groups.size() > 0",
                "ShardingType.PARTIAL requires non-empty replication groups.",
            )
        group_tile = _tile_list_to_array(group_assignment)
        for group in replication_groups:
            if not isinstance(group, list):
                raise check_failed(
                    'type == "list"',
                    f"Invalid replication group type: list is expected, got {type(group).__name__}",
                )
        members = [[int(m) for m in group] for group in replication_groups]
        if group_tile.size != len(members):
            raise check_failed("group_tile.num_elements() == group_members_view.size()", "")
        group_size = len(members[0])
        new_tile = np.empty((*group_tile.shape, group_size), dtype=np.int64)
        for index in np.ndindex(*new_tile.shape):
            new_tile[index] = members[int(group_tile[index[:-1]])][index[-1]]
        return _partial_tile(new_tile)
    if sharding_type == ShardingType.UNKNOWN:
        return ProtoType.UNKNOWN, (), (), False
    # TUPLE and out-of-range values: torch_xla logs an error and keeps the default proto,
    # whose type is REPLICATED.
    return ProtoType.REPLICATED, (), (), False


def shard_shape(sharding: OpSharding, global_shape: Sequence[int]) -> list[int]:
    """``ShardingUtil::GetShardShape``: the padded per-device shape."""
    kind = sharding.proto_type
    if kind in (ProtoType.REPLICATED, ProtoType.UNKNOWN):
        return list(global_shape)
    if kind == ProtoType.OTHER:
        dims = sharding.tile_assignment_dimensions
        out = []
        for j, n in enumerate(dims):
            if sharding.replicate_on_last_tile_dim and j == len(dims) - 1:
                continue
            out.append(global_shape[j] // n + (global_shape[j] % n != 0))
        return out
    raise check_failed("false", f"Unsupported OpSharding type {int(kind)}")


def replica_and_indices(
    sharding: OpSharding,
    tensor_shape: Sequence[int],
    device_ordinals: Sequence[int],
) -> list[tuple[int, Any]]:
    """``ShardingUtil::GetShardReplicaAndIndicesForDevices``.

    For each device (in the given order): ``(replica_id, Ellipsis)`` when replicated, else
    ``(replica_id, [slice(start, stop, 1), ...])`` clamped to the unpadded tensor.
    """
    kind = sharding.proto_type
    if kind in (ProtoType.REPLICATED, ProtoType.UNKNOWN):
        return [(int(d), Ellipsis) for d in device_ordinals]
    if kind != ProtoType.OTHER:
        raise check_failed("false", f"Unsupported OpSharding type {int(kind)}")
    shape = shard_shape(sharding, tensor_shape)
    dims = sharding.tile_assignment_dimensions
    position = {int(d): i for i, d in enumerate(device_ordinals)}
    out: list[tuple[int, Any] | None] = [None] * len(device_ordinals)
    for i, core in enumerate(sharding.tile_assignment_devices):
        if core not in position:
            continue
        replica_id = 0
        offset = i
        indices = []
        for j in range(len(dims) - 1, -1, -1):
            n_j = offset % dims[j]
            if sharding.replicate_on_last_tile_dim and j == len(dims) - 1:
                replica_id = n_j
                offset //= dims[j]
                continue
            start = min(n_j * shape[j], tensor_shape[j])
            stop = min((n_j + 1) * shape[j], tensor_shape[j])
            indices.append(slice(start, stop, 1))
            offset //= dims[j]
        indices.reverse()
        out[position[core]] = (replica_id, indices)
    missing = [d for d, o in zip(device_ordinals, out, strict=True) if o is None]
    if missing:
        raise check_failed("indices.size() > 0", f"no shard assigned to devices {missing}")
    return [o for o in out if o is not None]


def padded_shard(data: Any, indices: Any, padded_shape: Sequence[int]) -> Any:
    """``ShardingUtil::ShardTensor`` for one device: slice, then zero-pad on the right."""
    if indices is Ellipsis:
        return data.clone()
    piece = data[tuple(indices)].contiguous()
    pads: list[int] = []
    for j in range(len(padded_shape) - 1, -1, -1):
        pads += [0, int(padded_shape[j]) - piece.shape[j]]
    if any(pads):
        piece = torch.nn.functional.pad(piece, pads, value=0)
    return piece
