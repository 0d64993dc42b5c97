"""State-dict plumbing shared by the SPMD planners and the checkpoint manager.

Flattening, element assignment, plan de-duplication and narrowing are
``torch.distributed.checkpoint``'s own helpers; what is added here is the one value type they
do not know: ``_CpuShards``, a sharded tensor already copied to the host, which stays a leaf
when a state_dict is flattened.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch_xla.distributed.spmd as xs
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint._dedup_tensors import dedup_tensors
from torch.distributed.checkpoint._traverse import set_element, traverse_state_dict
from torch.utils._pytree import tree_flatten, tree_unflatten
from torch_xla import _XLAC as _xlac
from torch_xla.distributed.spmd import ShardingType, XLAShardedTensor

PATH_ITEM = str | int
OBJ_PATH = tuple[PATH_ITEM, ...]
FLATTEN_MAPPING = dict[str, OBJ_PATH]

__all__ = [
    "FLATTEN_MAPPING",
    "dedup_tensors",
    "flatten_state_dict",
    "narrow_tensor_by_index",
    "set_element",
]


@dataclass
class _CpuShards:
    """This host's shards of one sharded tensor, on the CPU, with the tensor's global shape."""

    shards: list[xs.XLAShard]
    global_shape: torch.Size


def _is_leaf_value(value: Any) -> bool:
    # A container holding one of these is walked into; the value itself is a leaf.
    return isinstance(value, torch.Tensor | _CpuShards)


def flatten_state_dict(state_dict: Any) -> tuple[dict[str, Any], FLATTEN_MAPPING]:
    """One level of ``"a.b.0"`` keys for a nested state_dict, and each key's original path.

    Raises ``ValueError`` when two paths join to the same key.
    """
    flat: dict[str, Any] = {}
    paths: FLATTEN_MAPPING = {}

    def visit(path: OBJ_PATH, value: Any) -> None:
        key = ".".join(str(part) for part in path)
        if key in flat:
            raise ValueError(f"duplicated flatten key {key}")
        flat[key] = value
        paths[key] = path

    traverse_state_dict(state_dict, visit, keep_traversing=_is_leaf_value)
    return flat, paths


def _is_sharded_tensor(x: Any) -> bool:
    """True for an XLAShardedTensor whose data is split over devices (not replicated)."""
    return isinstance(x, XLAShardedTensor) and x.sharding_type != ShardingType.REPLICATED


def _unwrap_xla_sharded_tensor(x: Any) -> Any:
    return x.global_tensor if isinstance(x, XLAShardedTensor) else x


def _cpu_shards_from_tensors(tensors: list[torch.Tensor]) -> list[_CpuShards]:
    """Each sharded tensor's local shards copied to the host, in one transfer for all."""
    pieces = _xlac._get_local_shards(tensors)
    places = _xlac._get_local_shard_replica_and_indices(tensors)
    out = []
    for tensor, tensor_pieces, tensor_places in zip(tensors, pieces, places, strict=True):
        shards = [
            xs.XLAShard(data, indices, device, replica)
            for (data, device), (replica, indices) in zip(tensor_pieces, tensor_places, strict=True)
        ]
        out.append(_CpuShards(shards=shards, global_shape=tensor.shape))
    return out


def _sharded_cpu_state_dict(state_dict: Any) -> Any:
    """``state_dict`` with every device tensor on the CPU: sharded ones as ``_CpuShards``.

    The structure is kept; values that are not tensors are kept as they are.
    """
    leaves, spec = tree_flatten(state_dict)
    leaves = [xs.wrap_if_sharded(leaf) for leaf in leaves]
    sharded = [leaf.global_tensor for leaf in leaves if _is_sharded_tensor(leaf)]
    host_shards = iter(_cpu_shards_from_tensors(sharded))

    def to_host(leaf: Any) -> Any:
        if _is_sharded_tensor(leaf):
            return next(host_shards)
        if isinstance(leaf, torch.Tensor):
            return _unwrap_xla_sharded_tensor(leaf).cpu()
        return leaf

    return tree_unflatten([to_host(leaf) for leaf in leaves], spec)
