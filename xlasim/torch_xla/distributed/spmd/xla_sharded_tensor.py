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
from torch.utils._pytree import tree_map_only
from torch_xla import _XLAC as _xlac

from xlasim.runtime.tensor import without_functionalization
from xlasim.sharding.op_sharding import ShardingType


@dataclass
class XLAShard:
    """One addressable device's piece of a sharded tensor, copied to the host when taken."""

    # The piece as the device stores it: an uneven split leaves zero padding at its end.
    data: torch.Tensor

    # Where the piece sits in the global tensor: Ellipsis when the tensor is replicated,
    # otherwise one slice per dimension (padding excluded, it is not part of the tensor).
    indices: Any

    # The runtime device holding the piece, e.g. 'TPU:3'.
    shard_device: str

    # 0 when the tensor is tiled; the replica group's index when it is partially replicated;
    # the device's global ordinal when it is fully replicated.
    replica_id: int

    def _unpadded_region(self) -> Any:
        # The leading part of `data` that maps onto the global tensor.
        if self.indices is Ellipsis:
            return Ellipsis
        return tuple(slice(0, span.stop - span.start) for span in self.indices)

    @property
    def unpadded_data(self) -> torch.Tensor:
        """``data`` without the padding of an uneven split."""
        return self.data[self._unpadded_region()]

    @unpadded_data.setter
    def unpadded_data(self, t: torch.Tensor) -> None:
        self.data[self._unpadded_region()] = t


@contextlib.contextmanager
def no_dispatch() -> Iterator[None]:
    """Runs the body with ``__torch_dispatch__`` handlers switched off."""
    with torch._C._DisableTorchDispatch():
        yield


def _missing_layout(name: str) -> ValueError:
    # Both halves of the layout (mesh_shape, partition_spec) get the same explanation.
    return ValueError(
        f"{name} must be specified to create DTensorSpec. "
        "If this tensor was created through torch operations, it may be auto-wrapped. "
        f"Use wrap_as_sharded_tensor() to set {name} before accessing _spec. "
    )


def _placements_for(partition_spec: Any, mesh_ndim: int) -> tuple[Placement, ...]:
    """DTensor placements (one per mesh dim) for a partition spec (one entry per tensor dim).

    Only integer entries name a mesh dim here; the first tensor dim naming a mesh dim is the
    one sharded over it, and a mesh dim no entry names replicates.
    """

    def placement(mesh_dim: int) -> Placement:
        hits = (dim for dim, entry in enumerate(partition_spec) if entry == mesh_dim)
        dim = next(hits, None)
        return Replicate() if dim is None else Shard(dim)

    return tuple(placement(mesh_dim) for mesh_dim in range(mesh_ndim))


def _partition_spec_for(placements: Any, ndim: int) -> tuple[Any, ...]:
    """The partition spec (one entry per tensor dim) that ``placements`` describe."""
    spec: list[Any] = [None] * ndim
    sharded = ((m, p.dim) for m, p in enumerate(placements) if isinstance(p, Shard))
    for mesh_dim, dim in sharded:
        if dim >= ndim:
            raise IndexError(
                f"Shard dimension {dim} is out of bounds for tensor with {ndim} dimensions"
            )
        spec[dim] = mesh_dim
    return tuple(spec)


def _wrapper_metadata(elem: torch.Tensor) -> dict[str, Any]:
    # The wrapper owns no storage; it looks exactly like the tensor it wraps.
    return {
        "strides": elem.stride(),
        "storage_offset": elem.storage_offset(),
        "dtype": elem.dtype,
        "layout": elem.layout,
        "device": elem.device,
    }


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
        wants_grad = kwargs.get("requires_grad", False)
        self = torch.Tensor._make_wrapper_subclass(
            cls, elem.size(), requires_grad=wants_grad, **_wrapper_metadata(elem)
        )
        # When the wrapper is the autograd leaf, the data it holds must not be one as well.
        self.global_tensor = elem.detach() if self.requires_grad else elem
        # Wrapping a sharded tensor again keeps whatever layout is not given anew.
        source = elem if isinstance(elem, XLAShardedTensor) else None
        self.mesh_shape = mesh_shape or getattr(source, "mesh_shape", None)
        self.partition_spec = partition_spec or getattr(source, "partition_spec", None)
        self._cached_spec = None
        return self

    @property
    def local_shards(self) -> list[XLAShard]:
        """This host's pieces, one per addressable device, as padded CPU snapshots."""
        # The two bindings list the local devices in the same order.
        target = [self.global_tensor]
        pieces = _xlac._get_local_shards(target)[0]
        places = _xlac._get_local_shard_replica_and_indices(target)[0]
        shards = []
        for (data, device), (replica, indices) in zip(pieces, places, strict=True):
            shards.append(
                XLAShard(data=data, indices=indices, shard_device=device, replica_id=replica)
            )
        return shards

    def load_local_shards_(self, shards: list[XLAShard]) -> None:
        """Writes ``shards`` (padded, one per local device) into the devices' data."""
        _xlac._load_local_shards(
            self.global_tensor, [s.data for s in shards], [s.shard_device for s in shards]
        )
        self.invalidate_spec_cache()

    @property
    def sharding_spec(self) -> str:
        return _xlac._get_xla_sharding_spec(self.global_tensor)

    @property
    def sharding_type(self) -> Any:
        # None (no annotation) is not a ShardingType: that fails here, as in torch_xla.
        return ShardingType(_xlac._get_xla_sharding_type(self.global_tensor))

    def __repr__(self) -> str:  # type: ignore[override]
        inner = getattr(self, "global_tensor", None)
        if inner is None:
            # Not fully constructed yet: show the values.
            return str(self.cpu())
        return f"XLAShardedTensor({inner})"

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]
        cls, func: Any, types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        """Runs ``func`` on the wrapped ``xla`` tensors and wraps the tensors it returns.

        The simulator's ``xla`` tensors are themselves a Python dispatch subclass, so the op
        is not run under ``no_dispatch()``: it must reach their handler.
        """
        args, kwargs = tree_map_only(XLAShardedTensor, _global_of, (args, kwargs or {}))
        with without_functionalization():
            out = func(*args, **kwargs)
        return tree_map_only(torch.Tensor, XLAShardedTensor, out)

    @property
    def _spec(self) -> DTensorSpec:  # type: ignore[override]
        """The DTensor view of ``mesh_shape`` and ``partition_spec`` (built once)."""
        if self._cached_spec is None:
            self._cached_spec = self._dtensor_spec()
        return self._cached_spec

    def _dtensor_spec(self) -> DTensorSpec:
        if self.mesh_shape is None:
            raise _missing_layout("mesh_shape")
        ids = torch.arange(xr.global_runtime_device_count()).reshape(self.mesh_shape)
        mesh = DeviceMesh("xla", ids)
        if self.partition_spec is None:
            raise _missing_layout("partition_spec")
        value = self.global_tensor
        return DTensorSpec(
            mesh=mesh,
            placements=_placements_for(self.partition_spec, len(self.mesh_shape)),
            tensor_meta=TensorMeta(shape=value.shape, stride=value.stride(), dtype=value.dtype),
        )

    @property
    def placements(self) -> tuple[Placement, ...]:
        """One DTensor placement per mesh axis (Shard(dim) or Replicate())."""
        try:
            spec = self._spec
        except Exception:
            raise ValueError(
                "Placements not available: XLAShardedTensor requires mesh_shape and "
                "partition_spec to be set. Use mark_sharding() to properly initialize sharding "
                "information."
            ) from None
        return spec.placements

    def invalidate_spec_cache(self) -> None:
        """Drops the DTensor spec built from the layout (it is rebuilt when next needed)."""
        self._cached_spec = None

    def redistribute(  # type: ignore[override]
        self, device_mesh: Any, placements: Any, *, async_op: bool = False
    ) -> XLAShardedTensor:
        """The tensor re-annotated for ``placements`` over ``device_mesh`` (a torch_xla Mesh).

        The new sharding is a custom-sharding annotation; with ``async_op`` it goes on a
        copy and this tensor keeps its own.
        """
        mesh_ndim = len(device_mesh.mesh_shape)
        if len(placements) != mesh_ndim:
            raise ValueError(
                f"Number of placements ({len(placements)}) must match mesh dimensions ({mesh_ndim})"
            )
        if any(isinstance(p, Partial) for p in placements):
            raise NotImplementedError(
                "Partial placement is not yet implemented and may have unexpected "
                "behavior. Use Shard or Replicate placements instead."
            )
        spec = _partition_spec_for(placements, self.global_tensor.dim())
        target = self.global_tensor.clone() if async_op else self.global_tensor
        _xlac._xla_annotate_custom_sharding(target, device_mesh.get_op_sharding(spec))
        return XLAShardedTensor(target, mesh_shape=device_mesh.mesh_shape, partition_spec=spec)

    # DTensor switches __torch_function__ off; this subclass takes torch.Tensor's own (a
    # classmethod) back, so torch functions keep returning XLAShardedTensor.
    __torch_function__ = vars(torch.Tensor)["__torch_function__"]


def _global_of(t: XLAShardedTensor) -> torch.Tensor:
    return t.global_tensor
