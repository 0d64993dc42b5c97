"""The Python half of torch_xla 2.9's SPMD API: meshes and partition specs -> OpSharding.

:class:`Mesh` validates a logical device mesh and turns partition specs into the tile
assignment, sharding type and replication groups that torch_xla hands to its C++ layer.  Its
assertion order, messages and numpy-derived results follow real torch_xla (checked by the
differential tests).  The one runtime dependency, the global device count, is passed in as
``num_devices``; the simulated ``torch_xla.distributed.spmd.Mesh`` subclasses :class:`Mesh`
and supplies it.

PYTEST_DONT_REWRITE: the asserts here are torch_xla's API (their messages are compared
with the real ones), so pytest must not rewrite them.
"""

from __future__ import annotations

import functools
import math
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any, Union

import numpy as np

from xlasim.sharding.messages import torch_xla_error
from xlasim.sharding.op_sharding import OpSharding, ShardingType

# One entry per tensor dim: a mesh axis (index or name), several axes, or None (replicated).
PartitionSpec = tuple[Union[tuple[Union[int, str], ...], int, str, None], ...]  # noqa: UP007


def _check_mesh(
    ids: np.ndarray, mesh_shape: tuple[int, ...], axis_names: Any, num_devices: int
) -> None:
    # XLA only runs meshes spanning every global device.
    assert num_devices > 0, "This requires XLA supported device(s)."
    assert len(ids) == num_devices, (
        f"Number of device IDs ({len(ids)}) must match the global number of devices ({num_devices})"
    )
    if axis_names is not None:
        n_names, n_dims = len(axis_names), len(mesh_shape)
        assert n_names == n_dims, (
            f"Number of axis names ({n_names}) must match mesh dimensions ({n_dims})"
        )
        assert len(set(axis_names)) == n_names, f"Axis names must be unique, got: {axis_names}"
    mesh_size = np.prod(mesh_shape)
    assert len(ids) == mesh_size, (
        f"Number of device IDs ({len(ids)}) must match mesh size ({mesh_size})"
    )
    assert len(np.unique(ids)) == len(ids), f"Device IDs must be unique, got: {ids}"


class Mesh:
    """A logical grid of the slice's devices, which partition specs refer to by axis.

    Args:
      device_ids: every global device id once, laid out row-major over ``mesh_shape``
        (ids index ``xr.global_runtime_device_attributes()``).
      mesh_shape: the size of each mesh axis.
      axis_names: optional names for the axes, one each.
      num_devices: the global device count (what torch_xla reads from the runtime).
    """

    device_ids: np.ndarray
    mesh_shape: tuple[int, ...]
    axis_names: tuple[str, ...] | None
    # What get_op_sharding builds: the simulated surface's subclass also counts each one
    # on the simulated runtime, as torch_xla's constructor does.
    op_sharding_type: type[OpSharding] = OpSharding

    def __init__(
        self,
        device_ids: np.ndarray | list[int],
        mesh_shape: tuple[int, ...],
        axis_names: tuple[str, ...] | None = None,
        *,
        num_devices: int,
    ) -> None:
        ids = device_ids if isinstance(device_ids, np.ndarray) else np.array(device_ids)
        _check_mesh(ids, mesh_shape, axis_names, num_devices)
        self.device_ids, self.mesh_shape, self.axis_names = ids, mesh_shape, axis_names
        limit = self.size()
        assert all(i < limit for i in ids), (
            f"Device IDs must be less than mesh size ({limit}), got: {ids}"
        )

    def size(self) -> Any:
        return np.prod(self.mesh_shape)

    def shape(self) -> OrderedDict[Any, int]:
        keys = range(len(self.mesh_shape)) if self.axis_names is None else self.axis_names
        return OrderedDict(zip(keys, self.mesh_shape, strict=False))

    def get_logical_mesh(self) -> np.ndarray:
        return self.device_ids.reshape(self.mesh_shape)

    def get_axis_name_idx(self, name: str) -> int | None:
        # Unnamed meshes raise TypeError here (``in None``), as torch_xla's do.
        names: Any = self.axis_names
        return names.index(name) if name in names else None

    # Cached per (mesh, spec), like torch_xla: repeated calls return the same OpSharding, and
    # a spec that is not hashable (a list) is a TypeError.
    @functools.cache  # noqa: B019
    def get_op_sharding(self, partition_spec: PartitionSpec) -> OpSharding:
        """The OpSharding that ``partition_spec`` means on this mesh (one object per spec)."""
        # A scalar (mark_sharding checked rank == spec length) can only be replicated.
        if len(partition_spec) == 0:
            return OpSharding([], [], [], ShardingType.REPLICATED)
        spec = resolve_axis_names(self, partition_spec)
        _check_mesh_axes(spec, self)
        tiles = tile_assignment(self, spec)
        # A spec shorter than the mesh leaves mesh axes over which the tensor is replicated.
        kind = (
            ShardingType.PARTIAL if tiles.ndim > len(spec) else sharding_type_of(spec, self.size())
        )
        groups, members = replication_groups(kind, tiles, spec)
        return self.op_sharding_type(tiles.tolist(), groups, members, int(kind))

    def __str__(self) -> str:
        """Convert Mesh to string representation (``Mesh.from_str`` reads it back)."""
        fields = {
            "device_ids": self.device_ids.tolist(),
            "mesh_shape": self.mesh_shape,
            "axis_names": self.axis_names,
        }
        return "{" + ", ".join(f"{k!r}: {v}" for k, v in fields.items()) + "}"


def _mesh_axes(spec: tuple[Any, ...]) -> np.ndarray:
    # np.hstack, not a plain flatten: its dtype quirks (object arrays when None is mixed in,
    # floats for empty tuples) decide which malformed specs fail, and where.
    return np.hstack(list(spec))


def _axes_text(mesh: Mesh) -> str:
    names = mesh.axis_names
    rank = len(mesh.mesh_shape)
    if names is None:
        return f"the mesh (shape {tuple(mesh.mesh_shape)}) has unnamed axes 0..{rank - 1}"
    listed = ", ".join(f"{i}={n!r}" for i, n in enumerate(names))
    return f"the mesh (shape {tuple(mesh.mesh_shape)}) has axes {listed}"


def _check_mesh_axes(spec: tuple[Any, ...], mesh: Mesh) -> None:
    used = [a for a in _mesh_axes(spec) if a is not None]
    mesh_rank = len(mesh.mesh_shape)
    # torch_xla asserts these; `if __debug__` keeps them off under `python -O` as well, and a
    # raise (not an assert statement) is what can carry the note.
    if __debug__ and not all(0 <= a < mesh_rank for a in used):
        raise torch_xla_error(
            AssertionError,
            f"partition_spec ({spec}) contains out of bound index into mesh_shape.",
            f"{_axes_text(mesh)}; a spec entry is None, an axis index, an axis name or a tuple "
            "of them",
        )
    if __debug__ and len(np.unique(used)) != len(used):
        raise _repeated_axes(spec, used, mesh)


def _repeated_axes(spec: tuple[Any, ...], used: list[Any], mesh: Mesh) -> AssertionError:
    twice = sorted({int(a) for a in used if used.count(a) > 1})
    names = mesh.axis_names
    which = ", ".join(f"{a} ({names[a]!r})" if names else str(a) for a in twice)
    return torch_xla_error(
        AssertionError,
        f"Each device mesh dimension should appear at most once in partition_spec {spec}.",
        f"mesh axis {which} is used more than once; {_axes_text(mesh)}",
    )


def sharding_type_of(partition_spec: tuple[Any, ...], num_devices: int) -> ShardingType:
    """The sharding type of a spec fully covering a mesh of ``num_devices``."""
    if num_devices == 1:
        return ShardingType.MAXIMAL
    replicated = [entry is None for entry in partition_spec]
    if all(replicated):
        return ShardingType.REPLICATED
    return ShardingType.PARTIAL if any(replicated) else ShardingType.TILED


def tile_assignment(mesh: Mesh, partition_spec: tuple[Any, ...]) -> np.ndarray:
    """The mesh with its axes reordered as the spec uses them, unused axes last.

    Each tiled (non-None) spec entry becomes one leading axis; a tuple entry merges the mesh
    axes it names (adjacent after the reordering) into one.
    """
    tiled = [entry for entry in partition_spec if entry is not None]
    used = _mesh_axes(tuple(tiled)).tolist() if tiled else []
    unused = [axis for axis in range(len(mesh.mesh_shape)) if axis not in used]
    tiles = mesh.get_logical_mesh().transpose(used + unused)
    # After the transpose each tiled entry's axes are adjacent, in spec order: one tile dim
    # per entry (the product of its axes), then the unused axes as they are.
    sizes = iter(tiles.shape)
    per_entry = [
        math.prod(next(sizes) for _ in range(len(entry) if isinstance(entry, tuple) else 1))
        for entry in tiled
    ]
    return tiles.reshape(per_entry + list(sizes))


def _tile_blocks(tiles: np.ndarray, n_tiled: int) -> Iterator[list[Any]]:
    # One block per index into the leading n_tiled (tiled) axes, in row-major order: the
    # devices holding the same shard.
    for index in np.ndindex(*tiles.shape[:n_tiled]):
        yield tiles[index].flatten().tolist()


def replication_groups(
    sharding_type: ShardingType, tiles: np.ndarray, partition_spec: tuple[Any, ...]
) -> tuple[Any, list[Any]]:
    """(group assignment, replication groups) for a PARTIAL sharding; empty otherwise.

    A partially replicated tensor is tiled across groups and replicated within each group.
    The group assignment has the tensor's rank, with size 1 on the replicated dims.
    """
    if sharding_type is not ShardingType.PARTIAL:
        return [], []
    tiled_sizes = iter(tiles.shape)
    n_tiled = sum(entry is not None for entry in partition_spec)
    members = list(_tile_blocks(tiles, n_tiled))
    group_shape = tuple(1 if entry is None else next(tiled_sizes) for entry in partition_spec)
    groups = np.arange(len(members)).reshape(group_shape).tolist()
    return groups, members


def resolve_axis_names(mesh: Mesh, partition_spec: tuple[Any, ...]) -> tuple[Any, ...]:
    """The spec with axis names replaced by mesh axis indices (types checked exactly)."""

    def resolve(entry: Any) -> Any:
        kind = type(entry)
        if kind is tuple:
            assert all(type(inner) is not tuple for inner in entry), (
                "Partition spec cannot contain nested tuples"
            )
            return resolve_axis_names(mesh, entry)
        if entry is None or kind is int:
            return entry
        if kind is str:
            if mesh.axis_names is None:
                # torch_xla looks the name up in the mesh's names, which are None here.
                raise torch_xla_error(
                    TypeError,
                    "argument of type 'NoneType' is not iterable",
                    f"the partition spec names axis {entry!r} but {_axes_text(mesh)}; "
                    f"give the Mesh axis_names or use axis indices",
                )
            index = mesh.get_axis_name_idx(entry)
            if index is None:
                raise torch_xla_error(
                    ValueError,
                    f"Axis name {entry} is not defined in the given mesh",
                    f"{entry!r} is not an axis name of this mesh; {_axes_text(mesh)}",
                )
            return index
        raise ValueError(f"Spec type {kind} is not supported in partition spec")

    return tuple(resolve(entry) for entry in partition_spec)
