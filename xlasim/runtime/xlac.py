"""The SPMD entry points of ``torch_xla._XLAC``, on simulated device tensors.

Each function mirrors the pybind binding of the same name in torch_xla 2.9
(``init_python_bindings.cpp`` / ``xla_sharding_util.cpp``): the same checks, in the same
order, failing with the same ``Check failed: <condition>: <message>`` RuntimeErrors.  The
simulated ``torch_xla._XLAC`` module re-exports them; the simulated ``spmd`` package calls them.

Data model: a simulated tensor keeps its whole global value in ``_elem`` and its annotation in
``_sharding`` (a :class:`TensorSharding`); per-device shards are cut from the global value
when asked for, with the zero padding torch_xla's ``ShardTensor`` adds to uneven shards.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from xlasim.runtime import hosts, memory
from xlasim.runtime import state as _runtime
from xlasim.sharding.op_sharding import (
    OpSharding,
    ProtoType,
    ShardingKind,
    check_failed,
    padded_shard,
    replica_and_indices,
    shard_shape,
)
from xlasim.sharding.tensor_sharding import TensorSharding

__all__ = [
    "OpSharding",
    "XlaShardingSpec",
    "_get_local_shard_replica_and_indices",
    "_get_local_shards",
    "_get_xla_op_sharding",
    "_get_xla_sharding_spec",
    "_get_xla_sharding_specs",
    "_get_xla_sharding_type",
    "_global_tensor_from_cpu_shards",
    "_load_local_shards",
    "_mark_manual_sharding",
    "_spmd_full_to_shard_shape",
    "_spmd_shard_to_full_shape",
    "_xla_annotate_custom_sharding",
    "_xla_clear_sharding",
    "_xla_mark_sharding",
]


def _tensor_module() -> Any:
    # Imported lazily: the core's tensor module imports the runtime, and the pure SPMD logic
    # must stay importable (and testable) without it.
    from xlasim.runtime import tensor as _tensor

    return _tensor


def xla_tensor(t: Any) -> Any:
    """``bridge::GetXlaTensor``: the simulated device tensor, or the real error."""
    cls = _tensor_module().XlaSimTensor
    if isinstance(t, cls):
        return t
    global_tensor = getattr(t, "global_tensor", None)  # XLAShardedTensor wraps one
    if isinstance(global_tensor, cls):
        return global_tensor
    kind = t.type() if isinstance(t, torch.Tensor) else type(t).__name__
    raise RuntimeError(f"Expected XLA tensor. Got: {kind}")


def _is_pending_ir(x: Any) -> bool:
    return getattr(x, "_node", None) is not None


def _count(name: str) -> None:
    rt = _runtime.active()
    if rt is not None:
        rt.metrics.inc(name)


def _require_spmd() -> Any:
    rt = _runtime.current()
    if not rt.spmd:
        raise check_failed(
            "UseVirtualDevice()", "Please enable SPMD via `torch_xla.runtime.use_spmd()`"
        )
    return rt


def _device_name(rt: Any, ordinal: int) -> str:
    return f"{rt.device_type}:{ordinal}"


def _ordinal(device: str) -> int:
    _, _, index = device.rpartition(":")
    return int(index)


# -- annotation ------------------------------------------------------------------------------
def _xla_mark_sharding(t: Any, sharding: OpSharding) -> None:
    """``ShardingUtil::XlaMarkSharding``."""
    _count("XlaMarkSharding")
    rt = _require_spmd()
    if sharding.proto_type == ProtoType.UNKNOWN:
        raise check_failed(
            "sharding.type() != xla::OpSharding::UNKNOWN",
            "Can't explicilty annotate with UNKNOWN sharding type.",
        )
    x = xla_tensor(t)
    new = TensorSharding(sharding, x.shape)
    if _is_pending_ir(x):
        # Not device data: torch_xla attaches a custom-sharding IR node instead of moving data.
        _annotate_custom(x, new)
        return
    current = x._sharding
    if current is not None:
        if current.same_as(new):
            return
        if not current.is_replicated:
            raise check_failed(
                "false", "Existing annotation must be cleared first: " + current.op.debug_string()
            )
    memory.check_fits(rt, x, new)
    start = time.perf_counter_ns()
    if rt.spec.num_hosts > 1:
        # The transfer takes each device's shard from the host that owns the device.
        x._elem = assemble_from_hosts(rt, _global_value(x), new)
    _count("VirtualDeviceUsage")
    _set_sharding(x, new)
    # The data moves to the devices as one buffer per addressable device.
    rt.metrics.inc("CreateDataHandles", len(rt.addressable_device_ids()))
    rt.metrics.add_sample("TransferToDeviceTime", time.perf_counter_ns() - start)


def _set_sharding(x: Any, sharding: TensorSharding) -> None:
    _count("SetShardingSpec")
    x._sharding = sharding


def _annotate_custom(x: Any, new: TensorSharding) -> None:
    _count("XlaAnnotateCustomSharding")
    _set_sharding(x, new)


def _xla_annotate_custom_sharding(t: Any, sharding: OpSharding) -> None:
    """``ShardingUtil::XlaAnnotateCustomSharding``."""
    x = xla_tensor(t)
    _require_spmd()
    if sharding.proto_type == ProtoType.UNKNOWN:
        raise check_failed(
            "sharding.type() != xla::OpSharding::UNKNOWN",
            "Can't explicilty annotate with UNKNOWN sharding type.",
        )
    _annotate_custom(x, TensorSharding(sharding, x.shape))


def _mark_manual_sharding(t: Any, sharding: OpSharding) -> None:
    x = xla_tensor(t)
    if not _is_pending_ir(x):
        raise check_failed(
            "IsNonDeviceDataIR(input)", "Marking any data tensors as manual is not supported"
        )
    _xla_mark_sharding(x, sharding)


def _xla_clear_sharding(t: Any) -> None:
    xla_tensor(t)._sharding = None


# -- queries ---------------------------------------------------------------------------------
def _get_xla_sharding_spec(t: Any) -> str:
    sharding = xla_tensor(t)._sharding
    return sharding.spec_string() if sharding is not None else ""


def _get_xla_sharding_specs(tensors: Sequence[Any]) -> list[str]:
    return [_get_xla_sharding_spec(t) for t in tensors]


def _get_xla_op_sharding(t: Any) -> OpSharding | None:
    sharding = xla_tensor(t)._sharding
    return sharding.op if sharding is not None else None


def _get_xla_sharding_type(t: Any) -> int | None:
    sharding = xla_tensor(t)._sharding
    return sharding.sharding_type() if sharding is not None else None


# -- shards ----------------------------------------------------------------------------------
def _sharded(x: Any, message: str = "Tensor is not sharded") -> TensorSharding:
    sharding = x._sharding
    if sharding is None:
        raise check_failed("xtensor->sharding_spec() != nullptr", message)
    return sharding


def _global_value(x: Any) -> torch.Tensor:
    _tensor_module().materialize([x])
    return x._elem.detach()


def _get_local_shards(tensors: Sequence[Any]) -> list[list[tuple[torch.Tensor, str]]]:
    rt = _runtime.current()
    local = rt.addressable_device_ids()
    out = []
    for t in tensors:
        x = xla_tensor(t)
        sharding = _sharded(x)
        value = _global_value(x)
        start = time.perf_counter_ns()
        padded = sharding.shard_shape()
        pieces = []
        for _replica, indices in replica_and_indices(sharding.op, tuple(x.shape), local):
            pieces.append(padded_shard(value, indices, padded))
        rt.metrics.add_sample("TransferFromDeviceTime", time.perf_counter_ns() - start)
        out.append([(p, _device_name(rt, d)) for p, d in zip(pieces, local, strict=True)])
    return out


def _get_local_shard_replica_and_indices(tensors: Sequence[Any]) -> list[list[tuple[int, Any]]]:
    rt = _runtime.current()
    local = rt.addressable_device_ids()
    out = []
    for t in tensors:
        x = xla_tensor(t)
        sharding = _sharded(x)
        out.append(replica_and_indices(sharding.op, tuple(x.shape), local))
    return out


def _shape_text(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


def _load_local_shards(t: Any, shards: Sequence[torch.Tensor], devices: Sequence[str]) -> None:
    x = xla_tensor(t)
    sharding = _sharded(x, "Cannot load local shards into a non sharded tensor")
    rt = _runtime.current()
    local = rt.addressable_device_ids()
    if len(devices) != len(local):
        raise check_failed(
            "devices.size() == client->GetLocalDevices().size()",
            "Shards must be provided for all local devices",
        )
    if sharding.op.proto_type == ProtoType.REPLICATED:
        raise check_failed(
            "sharding.type() != xla::OpSharding::REPLICATED",
            "Replicated tensor should not be loaded from _load_local_shards - use copy_",
        )
    padded = sharding.shard_shape()
    for shard in shards:
        if list(shard.shape) != list(padded):
            raise check_failed(
                "shard.sizes() == shard_shape",
                f"Input shard shape must include padding: {_shape_text(shard.shape)} vs "
                f"{_shape_text(padded)}",
            )
    value = _global_value(x).clone()
    ordinals = [_ordinal(d) for d in devices]
    shards, ordinals = _gather_shards(rt, shards, ordinals)
    _place_shards(value, sharding, shards, ordinals)
    x._elem = value
    x._node = None


def _gather_shards(
    rt: Any, shards: Sequence[torch.Tensor], ordinals: Sequence[int]
) -> tuple[list[torch.Tensor], list[int]]:
    """Every host's local shards and their device ordinals (each host holds the global value,
    so it needs the shards the other hosts loaded into their devices)."""
    if rt.spec.num_hosts == 1:
        return list(shards), list(ordinals)
    stacked = hosts.all_gather(rt, torch.stack([s.detach() for s in shards]))
    where = hosts.all_gather(rt, torch.tensor(list(ordinals), dtype=torch.int64))
    all_shards = [piece for host_shards in stacked for piece in host_shards]
    all_ordinals = [int(o) for host_ordinals in where for o in host_ordinals]
    return all_shards, all_ordinals


def _place_shards(
    value: torch.Tensor,
    sharding: TensorSharding,
    shards: Sequence[torch.Tensor],
    ordinals: Sequence[int],
) -> None:
    placed = replica_and_indices(sharding.op, tuple(value.shape), ordinals)
    for shard, (_replica, indices) in zip(shards, placed, strict=True):
        if indices is Ellipsis:
            value.copy_(shard)
            continue
        unpadded = tuple(slice(0, s.stop - s.start) for s in indices)
        value[tuple(indices)] = shard[unpadded].to(value.dtype)


def _global_tensor_from_cpu_shards(
    shards: Sequence[torch.Tensor],
    sharding: OpSharding,
    global_shape: Sequence[int] | None = None,
) -> Any:
    rt = _require_spmd()
    local = rt.addressable_device_ids()
    if len(local) != len(shards):
        raise check_failed(
            "local_devices.size() == shards.size()", "Must specify a shard for each local device"
        )
    if global_shape is not None and len(global_shape) != shards[0].dim():
        raise check_failed(
            "!global_shape.has_value() || global_shape.value().size() == shards[0].sizes().size()",
            f"Global shape rank must agree with shard rank: expected rank {shards[0].dim()}, "
            f"got {len(global_shape)}",
        )
    if global_shape is None:
        if sharding.proto_type == ProtoType.OTHER:
            dims = sharding.tile_assignment_dimensions
            global_shape = [dims[d] * shards[0].shape[d] for d in range(shards[0].dim())]
        elif sharding.proto_type == ProtoType.REPLICATED:
            global_shape = list(shards[0].shape)
        else:
            raise check_failed("false", f"Unsupported OpSharding type: {int(sharding.proto_type)}")
    spec = TensorSharding(sharding, global_shape)
    expected = shard_shape(sharding, spec.shape)
    for shard in shards:
        if list(shard.shape) != list(expected):
            raise check_failed(
                "shard.sizes() == expected_shard_shape",
                f"Input shard shape must include padding: {_shape_text(shard.shape)} vs "
                f"{_shape_text(expected)}",
            )
    value = torch.zeros(spec.shape, dtype=shards[0].dtype)
    if spec.op.proto_type == ProtoType.REPLICATED:
        value.copy_(shards[0])  # each host reads back its own replica
    else:
        all_shards, ordinals = _gather_shards(rt, shards, local)
        _place_shards(value, spec, all_shards, ordinals)
    tensor_mod = _tensor_module()
    out = tensor_mod.wrap_data(value, None)
    memory.check_fits(rt, out, spec)
    out._sharding = spec
    if shards[0].requires_grad:
        out.requires_grad_(True)
    return out


# -- host to device with a sharding (input pipelines, multi-host) ------------------------------
def assemble_from_hosts(rt: Any, value: torch.Tensor, sharding: TensorSharding) -> torch.Tensor:
    """The global value the devices hold after every host transferred its own copy of
    ``value`` with ``sharding``: each device's shard comes from its owner host's copy."""
    if rt.spec.num_hosts == 1 or sharding.is_replicated or sharding.is_manual:
        # Replicas are host-local copies: a host reads back its own.
        return value
    copies = hosts.all_gather(rt, value)
    if all(torch.equal(c, value) for c in copies):
        return value
    out = value.clone()
    devices = list(range(rt.spec.num_devices))
    for device, (_replica, indices) in zip(
        devices, sharding.replica_and_indices(devices), strict=True
    ):
        source = copies[hosts.owner_host(rt, device)]
        out[tuple(indices)] = source[tuple(indices)]
    return out


def _assemble_minibatch(rt: Any, local: torch.Tensor, sharding: TensorSharding) -> torch.Tensor:
    """``ShardingUtil::GetShardIndicesForMinibatchTensor``: each host cuts its batch into
    consecutive chunks, one per local device in device order; the tile assignment then says
    where each device's chunk sits in the global batch."""
    per_host = rt.spec.devices_per_host
    copies = hosts.all_gather(rt, local)
    chunk = local.shape[0] // per_host
    value = torch.zeros(sharding.shape, dtype=local.dtype)
    devices = list(range(rt.spec.num_devices))
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


def place_input(x: Any, sharding: XlaShardingSpec | None) -> Any:
    """The sharding half of ``_xla_tensors_from_aten`` for one freshly transferred tensor.

    Returns the device tensor to hand out: ``x`` itself, annotated, or (when a minibatch
    makes the global batch bigger than this host's part) a new tensor holding the global
    batch.  Without a sharding, SPMD transfers are replicated and say so ('{replicated}').
    """
    rt = _runtime.current()
    if sharding is None:
        if rt.spmd:
            x._sharding = TensorSharding(OpSharding.replicated(), tuple(x.shape))
        return x
    spec = TensorSharding(sharding.op, sharding.shape, sharding.minibatch)
    local = _global_value(x)
    if sharding.minibatch:
        value = _assemble_minibatch(rt, local, spec)
    else:
        value = assemble_from_hosts(rt, local, spec)
    if tuple(value.shape) == tuple(x.shape):
        x._elem = value
        target = x
    else:
        target = _tensor_module().wrap_data(value, x.device)
    memory.check_fits(rt, target, spec)
    target._sharding = spec
    return target


# -- manual sharding ---------------------------------------------------------------------------
def _spmd_full_to_shard_shape(t: Any) -> Any:
    x = xla_tensor(t)
    sharding = x._sharding
    if sharding is None:
        raise check_failed("sharding_spec != nullptr", "Input tensor is not sharded")
    raise NotImplementedError(
        "manual sharding (_spmd_full_to_shard_shape / enable_manual_sharding): the simulator "
        "runs one global program and cannot run a different computation on each device's shard"
    )


def _spmd_shard_to_full_shape(
    t: Any, sharding: OpSharding, output_shape: Sequence[int], output_dtype: Any
) -> Any:
    x = xla_tensor(t)
    current = x._sharding
    if current is None or current.op.proto_type != ProtoType.MANUAL:
        raise check_failed(
            "sharding_spec != nullptr && sharding_spec->sharding.type() == xla::OpSharding::MANUAL",
            "Input tensor is not manual sharded",
        )
    raise NotImplementedError(
        "manual sharding (_spmd_shard_to_full_shape / disable_manual_sharding) is not simulated"
    )


# -- input sharding (parallel loader) ----------------------------------------------------------
class XlaShardingSpec(TensorSharding):
    """``torch_xla._XLAC.XlaShardingSpec(tensor, tile_assignment, group_assignment,
    replication_groups, sharding_type, minibatch)``: an OpSharding bound to a global shape.

    With ``minibatch`` the tensor is this host's part of the batch and the global batch
    dimension is ``local * global_devices / local_devices``.
    """

    __slots__ = ()

    def __init__(
        self,
        tensor: torch.Tensor,
        tile_assignment: list[Any],
        group_assignment: list[Any],
        replication_groups: list[Any],
        sharding_type: int,
        minibatch: bool,
    ) -> None:
        shape = list(tensor.shape)
        if minibatch:
            rt = _runtime.current()
            num_local = len(rt.addressable_device_ids())
            num_global = len(rt.global_device_ids())
            if len(tile_assignment) != num_global:
                raise check_failed(
                    "tile_assignment.size() == num_global_devices",
                    "Minibatch sharding only supports sharding along the batch dimension",
                )
            shape[0] = shape[0] * num_global // num_local
        op = OpSharding(tile_assignment, group_assignment, replication_groups, sharding_type)
        super().__init__(op, shape, minibatch)


def sharding_kind_name(kind: int) -> str:
    return ShardingKind(kind).name
