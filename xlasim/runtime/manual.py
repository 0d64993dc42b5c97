"""Manual sharding: a sharded tensor seen as each device's own shard, and back.

Inside a manual region the partitioned program runs on every device with that device's data,
so one tensor holds a different value per device (``XlaSimTensor._manual``); each op on it
runs once per device (``xlasim.runtime.tensor``). Leaving the region assembles the devices'
values into one global tensor under the sharding the caller names.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from xlasim.runtime.graph import CustomCall, ManualCollective, stable_id
from xlasim.runtime.shards import place_shards
from xlasim.runtime.state import SimRuntime
from xlasim.runtime.tensor import XlaSimTensor, derived, make_manual, owned
from xlasim.sharding.op_sharding import OpSharding, padded_shard, replica_and_indices
from xlasim.sharding.tensor_sharding import TensorSharding


def _single_process(rt: SimRuntime, what: str) -> None:
    if rt.client.num_processes > 1:
        raise NotImplementedError(
            f"xlasim: {what} with {rt.client.num_processes} processes; manual sharding is "
            f"simulated in a single process that drives every device"
        )


def full_to_shard(rt: SimRuntime, x: XlaSimTensor, sharding: TensorSharding) -> XlaSimTensor:
    """``_spmd_full_to_shard_shape``: each device's (padded) shard of ``x``, as one manual
    tensor of the shard shape."""
    _single_process(rt, "_spmd_full_to_shard_shape / enable_manual_sharding")
    # A node of the graph in torch_xla, so a pending ``x`` runs nothing here (inside
    # torch_xla.compile that would be an unexpected execution); its value is already known.
    owned(x)
    value = x._elem.detach()
    padded = sharding.shard_shape()
    devices = rt.global_device_ids()
    pieces = [
        padded_shard(value, indices, padded)
        for _replica, indices in replica_and_indices(sharding.op, tuple(x.shape), devices)
    ]
    out = derived(
        x,
        pieces[0],
        "xla::spmd_full_to_shard_shape",
        stable_id(sharding.op.to_string()),
        CustomCall("SPMDFullToShardShape", "{manual}", tuple(pieces[0].shape)),
    )
    return make_manual(out, pieces)


_REDUCERS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "sum": torch.add,
    "mul": torch.mul,
    "min": torch.minimum,
    "max": torch.maximum,
    "and": torch.bitwise_and,
    "or": torch.bitwise_or,
}


def collective(
    rt: SimRuntime,
    x: XlaSimTensor,
    reduce_type: str,
    scale: float,
    groups: list[list[int]],
    scatter: tuple[int, int] | None = None,
) -> XlaSimTensor:
    """torch_xla's SPMD all-reduce (``scatter`` None) or reduce-scatter (``scatter`` = (dim,
    shard count)) of manual tensor ``x``: each device combines the values of the devices in its
    group (by device id) and, scattering, keeps its own piece."""
    name = "_xla_spmd_all_reduce" if scatter is None else "_xla_spmd_reduce_scatter"
    if x._manual is None:
        raise NotImplementedError(
            f"xlasim simulates torch_xla._XLAC.{name} only on manually sharded tensors "
            "(inside xs.enable_manual_sharding / disable_manual_sharding)"
        )
    if reduce_type not in _REDUCERS:
        raise RuntimeError(f"Unknown AllReduce type: {reduce_type}")
    devices = rt.global_device_ids()
    values = dict(zip(devices, x._manual, strict=True))
    groups = [list(g) for g in groups] if groups else [list(devices)]
    dim = None
    pieces = []
    for device in devices:
        group = next((g for g in groups if device in g), None)
        if group is None:
            raise RuntimeError(f"{name}: device {device} is in none of the groups {groups}")
        total = values[group[0]].clone()
        for other in group[1:]:
            total = _REDUCERS[reduce_type](total, values[other])
        if scatter is not None:
            dim, count = scatter[0] % total.dim(), scatter[1]
            if count != len(group) or total.shape[dim] % count:
                raise RuntimeError(
                    f"{name}: dimension {dim} of size {total.shape[dim]} does not split into "
                    f"{count} shards, one per device of the group {group}"
                )
            total = total.chunk(count, dim)[group.index(device)].clone()
        pieces.append(total * scale if scale != 1.0 else total)
    kind = "all-reduce" if scatter is None else "reduce-scatter"
    args = ManualCollective(kind, reduce_type, scale, groups, dim, tuple(pieces[0].shape))
    key = hash((stable_id(kind), stable_id(reduce_type), stable_id(str(groups)), dim))
    out = derived(x, pieces[0], f"xla::{name.removeprefix('_xla_')}", key, args)
    return make_manual(out, pieces)


def shard_to_full(
    rt: SimRuntime,
    x: XlaSimTensor,
    sharding: OpSharding,
    shape: list[int],
    dtype: torch.dtype,
) -> tuple[XlaSimTensor, TensorSharding]:
    """``_spmd_shard_to_full_shape``: the global tensor of ``shape`` whose shards under
    ``sharding`` are the devices' values of manual tensor ``x``."""
    _single_process(rt, "_spmd_shard_to_full_shape / disable_manual_sharding")
    spec = TensorSharding(sharding, shape)
    devices = rt.global_device_ids()
    values = x._manual if x._manual is not None else [x._elem] * len(devices)
    placed = replica_and_indices(sharding, tuple(shape), devices)
    first: dict[object, torch.Tensor] = {}
    for value, (_replica, indices) in zip(values, placed, strict=True):
        where = repr(indices)
        if where in first and not torch.equal(first[where], value):
            raise NotImplementedError(
                "xlasim: the devices that hold replicas of one shard computed different values "
                f"in the manual region ({spec.spec_string()}); which one torch_xla keeps is not "
                f"simulated"
            )
        first.setdefault(where, value)
    full = torch.zeros(shape, dtype=dtype)
    place_shards(full, spec, [v.to(dtype) for v in values], devices)
    key = hash((stable_id(sharding.to_string()), tuple(shape)))
    call = CustomCall("SPMDShardToFullShape", spec.spec_string(), tuple(shape))
    return derived(x, full, "xla::spmd_shard_to_full_shape", key, call), spec
