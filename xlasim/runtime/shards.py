"""Sharded device data: how the values of annotated tensors move between hosts and devices.

A simulated tensor keeps its whole global value in ``_elem`` and its annotation in
``_sharding`` (a :class:`TensorSharding`); per-device shards are cut from the global value
when asked for, with the zero padding torch_xla's ``ShardTensor`` adds to uneven shards.
Hosts hold different data only where data enters the devices from a host; there each
device's shard comes from its owner host (see :mod:`xlasim.runtime.hosts`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from xlasim.runtime import hosts, memory, state
from xlasim.runtime.state import SimRuntime
from xlasim.runtime.tensor import materialize, replace_values, wrap_data
from xlasim.sharding.op_sharding import OpSharding, replica_and_indices
from xlasim.sharding.tensor_sharding import TensorSharding


def global_value(x: Any) -> torch.Tensor:
    """The value of device tensor ``x`` (its pending graph run first)."""
    materialize([x])
    return x._elem.detach()


def gather_shards(
    rt: SimRuntime, shards: Sequence[torch.Tensor], ordinals: Sequence[int]
) -> tuple[list[torch.Tensor], list[int]]:
    """Every host's local shards and their device ordinals (each host holds the global value,
    so it needs the shards the other hosts loaded into their devices)."""
    if rt.client.num_processes == 1:
        return list(shards), list(ordinals)
    stacked = hosts.all_gather(rt, torch.stack([s.detach() for s in shards]))
    where = hosts.all_gather_ordinals(rt, list(ordinals))
    all_shards = [piece for host_shards in stacked for piece in host_shards]
    all_ordinals = [o for host_ordinals in where for o in host_ordinals]
    return all_shards, all_ordinals


def place_shards(
    value: torch.Tensor,
    sharding: TensorSharding,
    shards: Sequence[torch.Tensor],
    ordinals: Sequence[int],
) -> None:
    """Writes each device's (padded) shard into ``value``, the global tensor."""
    placed = replica_and_indices(sharding.op, tuple(value.shape), ordinals)
    for shard, (_replica, indices) in zip(shards, placed, strict=True):
        if indices is Ellipsis:
            value.copy_(shard)
            continue
        unpadded = tuple(slice(0, s.stop - s.start) for s in indices)
        value[tuple(indices)] = shard[unpadded].to(value.dtype)


def assemble_from_hosts(
    rt: SimRuntime, value: torch.Tensor, sharding: TensorSharding
) -> torch.Tensor:
    """The global value the devices hold after every host transferred its own copy of
    ``value`` with ``sharding``: each device's shard comes from its owner host's copy."""
    if rt.client.num_processes == 1 or sharding.is_replicated or sharding.is_manual or rt.dry_run:
        # Replicas are host-local copies: a host reads back its own (in a dry run, whose
        # values are shape-only, every copy is alike).
        return value
    copies = hosts.all_gather(rt, value)
    if all(torch.equal(c, value) for c in copies):
        return value
    out = value.clone()
    devices = rt.global_device_ids()
    for device, (_replica, indices) in zip(
        devices, sharding.replica_and_indices(devices), strict=True
    ):
        source = copies[hosts.owner_host(rt, device)]
        out[tuple(indices)] = source[tuple(indices)]
    return out


def _assemble_minibatch(
    rt: SimRuntime, local: torch.Tensor, sharding: TensorSharding
) -> torch.Tensor:
    """``ShardingUtil::GetShardIndicesForMinibatchTensor``: each host cuts its batch into
    consecutive chunks, one per local device in device order; the tile assignment then says
    where each device's chunk sits in the global batch."""
    per_host = rt.client.num_local
    copies = hosts.all_gather(rt, local)
    chunk = local.shape[0] // per_host
    value = torch.zeros(sharding.shape, dtype=local.dtype)
    devices = rt.global_device_ids()
    for device, (_replica, indices) in zip(
        devices, sharding.replica_and_indices(devices), strict=True
    ):
        host = hosts.owner_host(rt, device)
        first = (device - host * per_host) * chunk
        data = copies[host][first : first + chunk]
        if indices is Ellipsis:
            value.copy_(data)
            continue
        unpadded = tuple(slice(0, s.stop - s.start) for s in indices)
        value[tuple(indices)] = data[unpadded]
    return value


def place_input(x: Any, sharding: TensorSharding | None) -> Any:
    """The sharding half of ``_xla_tensors_from_aten`` for one freshly transferred tensor.

    Returns the device tensor to hand out: ``x`` itself, annotated, or (when a minibatch
    makes the global batch bigger than this host's part) a new tensor holding the global
    batch.  Without a sharding, SPMD transfers are replicated and say so ('{replicated}').
    """
    rt = state.current()
    if sharding is None:
        if rt.spmd:
            x._sharding = TensorSharding(OpSharding.replicated(), tuple(x.shape))
            memory.settle(rt, x)
        return x
    spec = TensorSharding(sharding.op, sharding.shape, sharding.minibatch)
    local = global_value(x)
    if sharding.minibatch:
        value = _assemble_minibatch(rt, local, spec)
    else:
        value = assemble_from_hosts(rt, local, spec)
    if tuple(value.shape) == tuple(x.shape):
        replace_values(x, value)
        memory.reshard(rt, x, spec)
        return x
    return wrap_data(value, x.device, spec)
