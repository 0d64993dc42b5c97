"""``torch_xla.distributed.spmd.xla_sharded_tensor`` on the simulator (torch_xla 2.9).

Same classes, fields and behaviour as the real module; the shard data comes from the
simulator's ``torch_xla._XLAC`` instead of PJRT buffers.

PYTEST_DONT_REWRITE: the asserts here are torch_xla's API (their messages are compared
with the real ones), so pytest must not rewrite them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch_xla.runtime as xr
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard
from torch.utils._pytree import tree_map
from torch_xla import _XLAC as _xlac

from xlasim.sharding.op_sharding import ShardingType


@dataclass
class XLAShard:
    # A snapshot of the shard data from the time of XLAShard creation.
    data: torch.Tensor

    # The indices of the shard into the global tensor. If the tensor is replicated
    # across local devices, the value of `indices` is Ellipsis. Otherwise, it is a
    # list of the index slices across each dimension.
    # The indices do not reflect padding, since the padding does not exist on the
    # global tensor.
    indices: Any

    # The device this shard's data originated from.
    shard_device: str

    # The replica this shard belongs to, as determined by the sharding:
    #  - TILED:       Since the tensor isn't replicated, replica_id is always 0.
    #  - PARTIAL:     replica_id is taken from the OpSharding and is a value in
    #                 the range [0, num_replica).
    #  - REPLICATED:  Since the tensor is fully replicated, replica_id is the
    #                 device's global ordinal.
    replica_id: int

    @property
    def unpadded_data(self) -> torch.Tensor:
        """Returns a copy of `data` with padding removed"""
        unpadded_indices = self.indices
        # Replicated data has Ellipsis as indices
        if self.indices != Ellipsis:
            unpadded_indices = [slice(0, s.stop - s.start) for s in self.indices]
        return self.data[unpadded_indices]

    @unpadded_data.setter
    def unpadded_data(self, t: torch.Tensor) -> None:
        unpadded_indices = self.indices
        if self.indices != Ellipsis:
            unpadded_indices = [slice(0, s.stop - s.start) for s in self.indices]
        self.data[unpadded_indices] = t


@contextlib.contextmanager
def no_dispatch() -> Iterator[None]:
    guard = torch._C._DisableTorchDispatch()
    try:
        yield
    finally:
        del guard


class XLAShardedTensor(DTensor):
    """A wrapper around an ``xla`` tensor with its sharding annotation (a DTensor in 2.9).

    It behaves like the unpartitioned global tensor; ``local_shards`` gives this host's
    per-device pieces.
    """

    global_tensor: torch.Tensor
    mesh_shape: Any
    partition_spec: Any
    _cached_spec: DTensorSpec | None

    __slots__ = ["global_tensor", "mesh_shape", "partition_spec", "_cached_spec"]

    @staticmethod
    def __new__(
        cls,
        elem: torch.Tensor,
        mesh_shape: Any = None,
        partition_spec: Any = None,
        *args: Any,
        **kwargs: Any,
    ) -> XLAShardedTensor:
        r = torch.Tensor._make_wrapper_subclass(
            cls,
            elem.size(),
            strides=elem.stride(),
            storage_offset=elem.storage_offset(),
            dtype=elem.dtype,
            layout=elem.layout,
            device=elem.device,
            requires_grad=kwargs.get("requires_grad", False),
        )
        r.global_tensor = elem.detach() if r.requires_grad else elem

        # Initialize mesh, partition, and spec information
        r.mesh_shape = mesh_shape or (
            elem.mesh_shape if isinstance(elem, XLAShardedTensor) else None
        )
        r.partition_spec = partition_spec or (
            elem.partition_spec if isinstance(elem, XLAShardedTensor) else None
        )
        r._cached_spec = None
        return r

    # Shards are a snapshot on CPU, detached from the global tensor; they include the
    # padding of uneven shards.
    @property
    def local_shards(self) -> list[XLAShard]:
        shard_dev = _xlac._get_local_shards([self.global_tensor])[0]
        replica_ind = _xlac._get_local_shard_replica_and_indices([self.global_tensor])[0]
        return [
            XLAShard(data, indices, dev, replica)
            for (data, dev), (replica, indices) in zip(shard_dev, replica_ind, strict=False)
        ]

    # Load the given list of local shards into the underlying tensor's data
    # on the local devices.
    def load_local_shards_(self, shards: list[XLAShard]) -> None:
        data = [s.data for s in shards]
        devices = [s.shard_device for s in shards]
        _xlac._load_local_shards(self.global_tensor, data, devices)

        # Invalidate cached spec since the global_tensor data has changed
        self.invalidate_spec_cache()

    @property
    def sharding_spec(self) -> str:
        return _xlac._get_xla_sharding_spec(self.global_tensor)

    @property
    def sharding_type(self) -> Any:
        sharding_type = _xlac._get_xla_sharding_type(self.global_tensor)
        return ShardingType(sharding_type)

    def __repr__(self) -> str:  # type: ignore[override]
        if not hasattr(self, "global_tensor"):
            # materialize a copy of sharded global_tensnor and keep the actual data
            # sharded on the XLA devices.
            return str(self.cpu())
        return f"XLAShardedTensor({self.global_tensor})"

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]
        cls, func: Any, types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        """Unwrap to the global ``xla`` tensor, run the op there, wrap tensor results."""

        def unwrap(elem: Any) -> Any:
            return elem.global_tensor if isinstance(elem, XLAShardedTensor) else elem

        def wrap(elem: Any) -> Any:
            return XLAShardedTensor(elem) if isinstance(elem, torch.Tensor) else elem

        # torch_xla runs the op under no_dispatch() because its global tensor is a C++ XLA
        # tensor; the simulator's global tensor is itself a Python dispatch subclass, so the
        # op must go through Python dispatch.
        return tree_map(wrap, func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {})))

    @property
    def _spec(self) -> DTensorSpec:  # type: ignore[override]
        """Convert XLA sharding information to DTensorSpec for DTensor interface compatibility."""
        if self._cached_spec is not None:
            return self._cached_spec

        if self.mesh_shape is not None:
            device_count = xr.global_runtime_device_count()
            device_list = list(range(device_count))
            mesh = DeviceMesh("xla", torch.tensor(device_list).reshape(self.mesh_shape))
        else:
            raise ValueError(
                "mesh_shape must be specified to create DTensorSpec. "
                "If this tensor was created through torch operations, it may be auto-wrapped. "
                "Use wrap_as_sharded_tensor() to set mesh_shape before accessing _spec. "
            )

        if self.partition_spec is not None:
            placements: list[Placement] = []
            for mesh_dim in range(len(self.mesh_shape)):
                # find tensor dimension sharded on this mesh dimension
                tensor_dim = None
                for t_dim, m_dim in enumerate(self.partition_spec):
                    if m_dim == mesh_dim:
                        tensor_dim = t_dim
                        break
                placements.append(Shard(tensor_dim) if tensor_dim is not None else Replicate())
        else:
            raise ValueError(
                "partition_spec must be specified to create DTensorSpec. "
                "If this tensor was created through torch operations, it may be auto-wrapped. "
                "Use wrap_as_sharded_tensor() to set partition_spec before accessing _spec. "
            )

        tensor_meta = TensorMeta(
            shape=self.global_tensor.shape,
            stride=self.global_tensor.stride(),
            dtype=self.global_tensor.dtype,
        )
        self._cached_spec = DTensorSpec(
            mesh=mesh, placements=tuple(placements), tensor_meta=tensor_meta
        )
        return self._cached_spec

    @property
    def placements(self) -> tuple[Placement, ...]:
        """The placements that describe how this tensor is distributed."""
        try:
            return self._spec.placements
        except:  # noqa: E722 - the real property swallows everything the same way
            raise ValueError(
                "Placements not available: XLAShardedTensor requires mesh_shape and "
                "partition_spec to be set. Use mark_sharding() to properly initialize sharding "
                "information."
            ) from None

    def invalidate_spec_cache(self) -> None:
        """Invalidate the cached DTensorSpec."""
        self._cached_spec = None

    def redistribute(  # type: ignore[override]
        self, device_mesh: Any, placements: Any, *, async_op: bool = False
    ) -> XLAShardedTensor:
        if len(placements) != len(device_mesh.mesh_shape):
            raise ValueError(
                f"Number of placements ({len(placements)}) must match mesh dimensions "
                f"({len(device_mesh.mesh_shape)})"
            )

        for placement in placements:
            if isinstance(placement, Partial):
                raise NotImplementedError(
                    "Partial placement is not yet implemented and may have unexpected "
                    "behavior. Use Shard or Replicate placements instead."
                )

        partition_spec: list[Any] = [None] * len(self.global_tensor.shape)
        for mesh_dim, placement in enumerate(placements):
            if isinstance(placement, Shard):
                if placement.dim >= len(self.global_tensor.shape):
                    raise IndexError(
                        f"Shard dimension {placement.dim} is out of bounds for tensor with "
                        f"{len(self.global_tensor.shape)} dimensions"
                    )
                partition_spec[placement.dim] = mesh_dim

        result_tensor = self.global_tensor.clone() if async_op else self.global_tensor
        op_sharding = device_mesh.get_op_sharding(tuple(partition_spec))
        _xlac._xla_annotate_custom_sharding(result_tensor, op_sharding)

        return XLAShardedTensor(
            result_tensor,
            mesh_shape=device_mesh.mesh_shape,
            partition_spec=tuple(partition_spec),
        )

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return super(DTensor, cls).__torch_function__(func, types, args, kwargs)
