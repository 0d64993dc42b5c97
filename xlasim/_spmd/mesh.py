"""The Python half of torch_xla 2.9's SPMD API: meshes and partition specs -> OpSharding.

This is ``torch_xla/distributed/spmd/xla_sharding.py``'s ``Mesh`` arithmetic, kept statement
for statement (so assertion order, messages and numpy quirks are the real ones), with the one
runtime dependency -- ``xr.global_runtime_device_count()`` -- passed in as ``num_devices``.
The simulated ``torch_xla.distributed.spmd.Mesh`` subclasses :class:`Mesh` and supplies it.

Copyright: the PyTorch/XLA authors (BSD-3-Clause); adapted for the simulator.

PYTEST_DONT_REWRITE: the asserts here are torch_xla's API (their messages are compared
with the real ones), so pytest must not rewrite them.
"""

# The numpy/assert idioms are torch_xla's; keeping them is the point of this module.
# ruff: noqa: E711, SIM108, B905, UP033

from __future__ import annotations

import functools
import itertools
from collections import OrderedDict
from enum import IntEnum
from typing import Any, Union

import numpy as np

from xlasim._spmd.op_sharding import OpSharding

PartitionSpec = tuple[Union[tuple[Union[int, str], ...], int, str, None], ...]  # noqa: UP007


class ShardingType(IntEnum):
    # ShardingType enum ID maps to OpSharding.Type (https://shorturl.at/pvAJX)
    REPLICATED = 0
    MAXIMAL = 1
    TUPLE = 2
    TILED = 3
    MANUAL = 4
    PARTIAL = 5
    UNKNOWN = 6  # implicit replication. TODO(yeounoh) wait for auto-sharding support


class Mesh:
    """Describe the logical XLA device topology mesh and the underlying resources.

    Args:
      device_ids: A flattened list of devices (IDs), reshaped row-major to ``mesh_shape``.
        Each ID indexes into ``xr.global_runtime_device_attributes()``.
      mesh_shape: A int tuple describing the shape of the device mesh.
      axis_names: A sequence of mesh axis names, one per mesh dimension.
      num_devices: the global device count (what torch_xla reads from the runtime).
    """

    device_ids: np.ndarray
    mesh_shape: tuple[int, ...]
    axis_names: tuple[str, ...] | None

    def __init__(
        self,
        device_ids: np.ndarray | list[int],
        mesh_shape: tuple[int, ...],
        axis_names: tuple[str, ...] | None = None,
        *,
        num_devices: int,
    ) -> None:
        if not isinstance(device_ids, np.ndarray):
            device_ids = np.array(device_ids)

        # At the moment, XLA requires that the Mesh uses the global number of
        # devices.
        assert num_devices > 0, "This requires XLA supported device(s)."
        assert num_devices == len(device_ids), (
            f"Number of device IDs ({len(device_ids)}) must match the global number of "
            f"devices ({num_devices})"
        )

        if axis_names is not None:
            assert len(mesh_shape) == len(axis_names), (
                f"Number of axis names ({len(axis_names)}) must match mesh dimensions "
                f"({len(mesh_shape)})"
            )
            assert len(set(axis_names)) == len(axis_names), (
                f"Axis names must be unique, got: {axis_names}"
            )

        expected_devices = np.prod(mesh_shape)
        assert len(device_ids) == expected_devices, (
            f"Number of device IDs ({len(device_ids)}) must match mesh size ({expected_devices})"
        )
        assert len(device_ids) == len(np.unique(device_ids)), (
            f"Device IDs must be unique, got: {device_ids}"
        )

        self.device_ids = device_ids
        self.mesh_shape = mesh_shape
        self.axis_names = axis_names
        assert all(d < self.size() for d in device_ids), (
            f"Device IDs must be less than mesh size ({self.size()}), got: {device_ids}"
        )

    def size(self) -> Any:
        return np.prod(self.mesh_shape)

    def shape(self) -> OrderedDict[Any, int]:
        if self.axis_names is None:
            return OrderedDict((dim, size) for dim, size in enumerate(self.mesh_shape))
        return OrderedDict((name, size) for name, size in zip(self.axis_names, self.mesh_shape))

    def get_logical_mesh(self) -> np.ndarray:
        return self.device_ids.reshape(self.mesh_shape)

    def get_axis_name_idx(self, name: str) -> int | None:
        if name not in self.axis_names:  # type: ignore[operator]  # real raises TypeError too
            return None
        return self.axis_names.index(name)  # type: ignore[union-attr]

    @functools.lru_cache(maxsize=None)  # noqa: B019 - torch_xla caches per mesh the same way
    def _get_op_sharding_args(self, partition_spec: PartitionSpec) -> tuple[Any, Any, Any, int]:
        partition_spec = _translate_named_partition_spec(self, partition_spec)
        flat_specs: Any = np.hstack([d for d in partition_spec])  # type: ignore[misc]
        specs = [d for d in flat_specs if d is not None]
        assert all(d >= 0 and d < len(self.mesh_shape) for d in specs), (
            f"partition_spec ({partition_spec}) contains out of bound index into mesh_shape."
        )
        assert len(specs) == len(np.unique(specs)), (
            f"Each device mesh dimension should appear at most once in partition_spec "
            f"{partition_spec}."
        )

        tile_assignment = _get_tile_assignment(self, partition_spec)
        if len(tile_assignment.shape) > len(partition_spec):
            # Use partial replication for sharding a tensor over a higher-rank mesh
            sharding_type = ShardingType.PARTIAL
        else:
            sharding_type = _get_sharding_type(partition_spec, self.size())
        replicate_dims = {i for i, d in enumerate(partition_spec) if d is None}
        group_assignment, replication_groups = _get_group_assignment(
            sharding_type, tile_assignment, len(partition_spec), replicate_dims
        )

        return tile_assignment.tolist(), group_assignment, replication_groups, int(sharding_type)

    @functools.lru_cache(maxsize=None)  # noqa: B019
    def get_op_sharding(self, partition_spec: PartitionSpec) -> OpSharding:
        """Return the OpSharding for the given partition spec (cached per mesh)."""
        # For scalar tensors, it can only be replicated.
        # We have made sure len(t.shape) == len(partition_spec)
        # in mark_sharding API.
        if len(partition_spec) == 0:
            return OpSharding([], [], [], ShardingType.REPLICATED)

        tile_assignment, group_assignment, replication_groups, sharding_type = (
            self._get_op_sharding_args(partition_spec)
        )
        return OpSharding(tile_assignment, group_assignment, replication_groups, sharding_type)

    def __str__(self) -> str:
        """Convert Mesh to string representation."""
        return (
            f"{{'device_ids': {self.device_ids.tolist()}, "
            f"'mesh_shape': {self.mesh_shape}, "
            f"'axis_names': {self.axis_names}}}"
        )


def _get_sharding_type(partition_spec: PartitionSpec, num_devices: int) -> ShardingType:
    sharding_type = ShardingType.TILED
    if num_devices == 1:
        sharding_type = ShardingType.MAXIMAL
    elif all(d is None for d in partition_spec):
        sharding_type = ShardingType.REPLICATED
    elif any(d is None for d in partition_spec):
        sharding_type = ShardingType.PARTIAL
    return sharding_type


def _get_tile_assignment(mesh: Mesh, partition_spec: PartitionSpec) -> np.ndarray:
    """Permute the mesh into the tile assignment; tuple entries merge adjacent axes."""
    # Flatten the partition spec and ensure that it is fully specified over the
    # mesh for permutation.
    tiled_dims = [x for x in partition_spec if x is not None]
    permutation = np.hstack(tiled_dims).tolist() if tiled_dims else []
    missing_axes = sorted(set(range(len(mesh.shape()))) - set(permutation))
    tile_assignment = mesh.get_logical_mesh().transpose(permutation + missing_axes)

    # For any tuples in the partition_spec, the grouped axes will be adjacent
    # after the permutation. Combine these dimensions into a single axis.
    for i, spec in enumerate(tiled_dims):
        if isinstance(spec, tuple):
            shape = tile_assignment.shape
            tile_assignment = tile_assignment.reshape(shape[:i] + (-1,) + shape[i + len(spec) :])

    return tile_assignment


def _get_group_assignment(
    sharding_type: ShardingType,
    tile_assignment: np.ndarray,
    tensor_rank: int,
    replicate_dims: set[int],
) -> tuple[list[Any], list[Any]]:
    """Group placement and members for partial replication (torch_xla's algorithm)."""
    group_assignment: Any = list()
    replication_groups: list[Any] = list()
    if sharding_type is ShardingType.PARTIAL:
        # Shard across groups and replicate within subgroups; replicated dims
        # will be used to group replication devices.
        tile_shape = tile_assignment.shape
        # When creating the tile assignment, the mesh is permuted so that the first
        # few axes are used for tiling.
        tile_dims = range(tensor_rank - len(replicate_dims))
        group_list = [tile_assignment]
        for d in tile_dims:
            _group_list = list()
            for group_members in group_list:
                _group_list += np.split(group_members, tile_shape[d], d)
            group_list = _group_list
        replication_groups = [group.flatten().tolist() for group in group_list]

        mesh_axis = itertools.count()
        group_tile_shape = [
            1 if d in replicate_dims else tile_shape[next(mesh_axis)] for d in range(tensor_rank)
        ]
        group_assignment = (
            np.arange(len(replication_groups)).reshape(tuple(group_tile_shape)).tolist()
        )
    return group_assignment, replication_groups


def _translate_named_partition_spec(mesh: Mesh, partition_spec: PartitionSpec) -> tuple[Any, ...]:
    _partition_spec: list[Any] = list()
    for p in partition_spec:
        if type(p) is tuple:
            assert not any(type(x) is tuple for x in p), (
                "Partition spec cannot contain nested tuples"
            )
            _partition_spec.append(_translate_named_partition_spec(mesh, p))
        elif (p is None) or (type(p) is int):
            _partition_spec.append(p)
        elif type(p) is str:
            idx = mesh.get_axis_name_idx(p)
            if idx is None:
                raise ValueError(f"Axis name {p} is not defined in the given mesh")
            _partition_spec.append(idx)
        else:
            raise ValueError(f"Spec type {type(p)} is not supported in partition spec")
    return tuple(_partition_spec)
