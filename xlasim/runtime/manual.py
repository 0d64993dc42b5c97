"""Manual sharding: a sharded tensor seen as each device's own shard, and back.

Inside a manual region the partitioned program runs on every device with that device's data,
so one tensor holds a different value per device (``XlaSimTensor._manual``); each op on it
runs once per device (``xlasim.runtime.tensor``). Leaving the region assembles the devices'
values into one global tensor under the sharding the caller names.
"""

from __future__ import annotations

import torch

from xlasim.runtime.graph import CustomCall, stable_id
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
