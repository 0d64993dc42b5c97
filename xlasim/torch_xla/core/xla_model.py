"""Simulated ``torch_xla.core.xla_model``."""

from __future__ import annotations

import contextlib
import functools
import io
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO, TypedDict

import torch
import torch_xla
import torch_xla.runtime as runtime
import torch_xla.utils.closures as xc
import torch_xla.utils.utils as xu
from torch import optim
from typing_extensions import deprecated

from xlasim.runtime import functional_collectives as _functional_collectives
from xlasim.runtime import memory as _memory
from xlasim.runtime import pending_fx as _pending_fx
from xlasim.runtime import replicas as _replicas
from xlasim.runtime import state as _runtime
from xlasim.runtime import tensor as _tensor
from xlasim.runtime.settings import tpu_compiler_layer

REDUCE_SUM = "sum"
REDUCE_MUL = "mul"
REDUCE_AND = "and"
REDUCE_OR = "or"
REDUCE_MIN = "min"
REDUCE_MAX = "max"


class DeviceContext:
    def __init__(self, device: str | torch.device) -> None:
        self.device = device
        self.device_index = 0


def _get_device_context(device: str | torch.device | None = None) -> DeviceContext:
    contexts = _runtime.current().device_contexts
    key = str(device) if device is not None else torch_xla._XLAC._xla_get_default_device()
    if key not in contexts:
        contexts[key] = DeviceContext(key)
    return contexts[key]


def is_xla_tensor(tensor: torch.Tensor) -> bool:
    return tensor.device.type == "xla"


def get_xla_supported_devices(max_devices: int | None = None) -> list[str]:
    # A slice, so a negative max_devices drops devices from the end as in torch_xla.
    ordinals = range(len(_runtime.current().xla_devices()))
    return [f"xla:{i}" for i in (ordinals[:max_devices] if max_devices else ordinals)]


def get_local_ordinal() -> int:
    return runtime.local_ordinal()


def is_master_ordinal(local: bool = True) -> bool:
    """Whether this process's default device is the first (of its host, or of the slice)."""
    ordinal = runtime.local_ordinal if local else runtime.global_ordinal
    return ordinal() == 0


def master_print(
    *args: Any, fd: TextIO = sys.stdout, local: bool = False, flush: bool = False
) -> None:
    """``print`` on the master ordinal only."""
    if not is_master_ordinal(local=local):
        return
    print(*args, file=fd, flush=flush)


@deprecated("Use torch_xla.device instead")
def xla_device(n: int | None = None, devkind: str | None = None) -> torch.device:
    # devkind has had no effect since PJRT; torch_xla 2.9 accepts and drops it too.
    return torch_xla.device(n)


def _xla_real_device(device: str | torch.device) -> Any:
    """The runtime device (e.g. 'TPU:2') behind an ``xla:N`` device."""
    text = str(device)
    kind, colon, ordinal = text.partition(":")
    if kind != "xla" or not colon or not ordinal.isdigit():
        raise RuntimeError(f"Invalid device format: {text}")
    return _runtime.current().xla_devices()[int(ordinal)]


def xla_real_devices(devices: list[torch.device] | None = None) -> list[str]:
    chosen = devices or get_xla_supported_devices()
    return [_xla_real_device(d) for d in chosen]


def xla_device_hw(device: str | torch.device) -> str:
    return _xla_real_device(device).partition(":")[0]


def xla_device_kind(device: str | torch.device | None = None) -> str:
    # Every device of a PJRT client is the same kind.
    return _runtime.current().client.device_kind


def _parse_real_device(name: str) -> tuple[str, int]:
    kind, _, ordinal = name.partition(":")
    if not (kind.isidentifier() and ordinal.isdigit()):
        raise RuntimeError(f"Invalid device format: {name}")
    return kind, int(ordinal)


def xla_replication_devices(local_devices: list[Any] | None = None) -> list[str]:
    """Every runtime device of the local devices' kind, by ordinal (what replication spans)."""
    kinds = {_parse_real_device(d)[0] for d in xla_real_devices(local_devices)}
    if len(kinds) != 1:
        raise RuntimeError(
            "Cannot replicate across different device types: devices="
            f"{local_devices}/{xla_real_devices(local_devices)}"
        )
    (kind,) = kinds
    supported = get_xla_supported_devices()
    if len(supported) != len(local_devices):  # type: ignore[arg-type]
        raise RuntimeError(
            f"Cannot replicate if number of devices ({len(local_devices)}) is different "  # type: ignore[arg-type]
            f"from {len(supported)}"
        )
    same_kind = [
        d for d in torch_xla._XLAC._xla_get_all_devices() if _parse_real_device(d)[0] == kind
    ]
    return sorted(same_kind, key=lambda d: _parse_real_device(d)[1])


def set_replication(device: torch.device | str, devices: list[Any]) -> None:
    """Makes this process one replica of ``devices`` (``[]``: not replicated).

    Replication sets ``xr.world_size()`` to the number of devices of that kind, if nothing
    asked for the world size before.
    """
    device = str(device)
    context = _get_device_context(device=device)
    names = [str(d) for d in devices]
    torch_xla._XLAC._xla_set_replication_devices(xla_replication_devices(names) if names else [])
    context.device_index = names.index(device) if names else 0
    torch_xla._XLAC._set_all_reduce_token(context.device, None)
    torch_xla._XLAC._xla_set_default_device(device)


def unlazy(tensors: list[torch.Tensor]) -> None:
    """Computes the given tensors now (their pending graph only)."""
    _tensor.materialize([t for t in tensors if isinstance(t, _tensor.XlaSimTensor)])


def _fetch_gradients(optimizer: optim.Optimizer) -> list[torch.Tensor]:
    """The gradient tensors of every parameter the optimizer steps."""
    params = (p for group in optimizer.param_groups for p in group["params"])
    return [p.grad.data for p in params if isinstance(p, torch.Tensor) and p.grad is not None]


def _multi_replica(name: str) -> Exception:
    # One process replicated over several devices (xm.set_replication): on a TPU slice each
    # device needs its own process, and torch_xla waits for the missing replicas until its
    # rendezvous times out and aborts.
    world, processes = runtime.world_size(), runtime.process_count()
    threads = _runtime.current().device_threads
    if threads > 1:
        # The PJRT CPU client's xmp.spawn: torch_xla's replicas are threads of this process.
        return NotImplementedError(
            f"xlasim does not simulate xm.{name} between the {threads} device threads that "
            "xmp.spawn runs in one process on the PJRT CPU client (CPU_NUM_DEVICES > 1)"
        )
    return RuntimeError(
        f"xm.{name}: xr.world_size() is {world} (xm.set_replication over {world} devices) "
        f"but only {processes} process(es) take part, so the other replicas never join; "
        "real torch_xla aborts after its rendezvous timeout here. Run one process per "
        "device (torch_xla.launch / xmp.spawn, `accelerate launch`), or use SPMD"
    )


def _replica_rows(value: torch.Tensor, groups: Any, name: str) -> tuple[torch.Tensor, int, int]:
    """``_gathered``, or the value as its own one row when this is the only replica."""
    if runtime.world_size() == 1:
        return value.unsqueeze(0), 0, 1
    return _gathered(value, groups, name)


def _gathered(value: torch.Tensor, groups: Any, name: str) -> tuple[torch.Tensor, int, int]:
    """Every replica of this one's group's ``value`` stacked along a new dim 0, this replica's
    position in its group, and the group's size.

    The simulated processes exchange their values when the op runs (one gather of every
    replica's value); each replica then keeps its group's rows.
    """
    ordinal = runtime.global_ordinal()
    group = None
    if groups:
        group = next((list(g) for g in groups if ordinal in g), None)
        if group is None:
            raise ValueError(f"xm.{name}: replica {ordinal} is in none of the groups {groups}")
        if len(group) == 1:
            return value.unsqueeze(0), 0, 1  # a group of one meets no other replica
    if runtime.world_size() != runtime.process_count():
        raise _multi_replica(name)
    everyone = _replicas.replica_all_gather(value)
    if group is None:
        return everyone, ordinal, runtime.world_size()
    rows = torch.tensor(group, dtype=torch.int64).to(value.device)
    return everyone.index_select(0, rows), group.index(ordinal), len(group)


_REDUCERS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    REDUCE_SUM: torch.add,
    REDUCE_MUL: torch.mul,
    REDUCE_MIN: torch.minimum,
    REDUCE_MAX: torch.maximum,
    REDUCE_AND: torch.bitwise_and,
    REDUCE_OR: torch.bitwise_or,
}


def _reduce(reduce_type: str, rows: torch.Tensor) -> torch.Tensor:
    """The rows combined in replica order, in their own dtype (as an XLA all-reduce is)."""
    if reduce_type not in _REDUCERS:
        raise RuntimeError(f"Invalid reduce type: {reduce_type}")
    op = _REDUCERS[reduce_type]
    parts = rows.unbind(0)
    result = parts[0].clone()  # a replica's own row is a view of its input
    for part in parts[1:]:
        result = op(result, part)
    return result


def _count(binding: str) -> None:
    """torch_xla counts each call of its collective bindings as ``xla::<binding>`` (the C++
    function behind ``torch_xla._XLAC._xla_all_gather`` and the like, or the traceable
    ``_c10d_functional`` op); tests check these to see which collective ran."""
    _runtime.count("xla::" + binding)


def _all_reduce_one(
    reduce_type: str, value: torch.Tensor, scale: float, groups: Any
) -> torch.Tensor:
    # One replica (XLA_ALWAYS_ALLREDUCE): the reduction of its own value, scale applied.
    rows, _, _ = _replica_rows(value, groups, "all_reduce")
    result = _reduce(reduce_type, rows)
    return result * scale if scale != 1.0 else result


def all_reduce(
    reduce_type: str,
    inputs: torch.Tensor | list[torch.Tensor],
    scale: float = 1.0,
    groups: list[list[int]] | None = None,
    pin_layout: bool = True,
) -> Any:
    """The reduction over the replicas: a new tensor for a tensor, in place for a list."""
    if runtime.world_size() == 1 and not xu.getenv_as("XLA_ALWAYS_ALLREDUCE", bool, False):
        # torch_xla returns a clone with the scale NOT applied when there is one replica.
        return inputs.clone() if isinstance(inputs, torch.Tensor) else inputs
    if isinstance(inputs, torch.Tensor):
        # The plain form is torch_xla's traceable ``_c10d_functional.all_reduce``.
        plain = scale == 1.0 and not groups and pin_layout
        _count("all_reduce" if plain else "AllReduce")
        return _all_reduce_one(reduce_type, inputs, scale, groups)
    _count("AllReduceInPlace")
    with torch.no_grad():
        for tensor in inputs:
            tensor.copy_(_all_reduce_one(reduce_type, tensor, scale, groups))
    return inputs


def _into_output(output: torch.Tensor, result: torch.Tensor) -> None:
    """An ``output=`` tensor takes the collective's result as its value, whatever its shape was
    (torch_xla's out-variants replace the tensor's data; its ``.cpu()`` then has the result's
    shape)."""
    if output.shape == result.shape:
        output.copy_(result)
    else:
        output.set_(result)  # type: ignore[call-overload]


def _all_gather_one(value: torch.Tensor, dim: int, groups: Any) -> torch.Tensor:
    if runtime.world_size() == 1:
        return value.clone()
    rows, _, _ = _gathered(value, groups, "all_gather")
    return torch.cat(rows.unbind(0), dim=dim)


def all_gather(
    value: torch.Tensor,
    dim: int = 0,
    groups: list[list[int]] | None = None,
    output: torch.Tensor | None = None,
    pin_layout: bool = True,
    channel_id: Any = None,
    use_global_device_ids: Any = None,
) -> Any:
    """Every replica's ``value`` concatenated along ``dim``, in replica order."""
    if isinstance(value, list) and all(isinstance(v, torch.Tensor) for v in value):
        if pin_layout:
            raise RuntimeError(
                "For xm.all_gather with list of tensors input, pin_layout=True is not yet "
                "supported."
            )
        if output is not None:
            if not isinstance(output, list) or any(not isinstance(v, torch.Tensor) for v in output):
                raise TypeError(
                    f"`output` needs to be a list of Tensors, but given {type(output)}."
                )
            if len(output) != len(value):
                raise ValueError(
                    f"`output` length doesn't match `input` length: {len(output)} vs {len(value)}."
                )
            for out, v in zip(output, value, strict=True):
                _into_output(out, _all_gather_one(v, dim, groups))
            return output
        return [_all_gather_one(v, dim, groups) for v in value]
    if not isinstance(value, torch.Tensor):
        raise TypeError(
            f"`value` needs to be a Tensor or a list of Tensors, but given {type(value)}."
        )
    if pin_layout and output is None:
        # torch_xla pins this layout by gathering through a padded all-reduce.
        if runtime.world_size() > 1 or xu.getenv_as("XLA_ALWAYS_ALLREDUCE", bool, False):
            _count("all_reduce" if not groups else "AllReduce")
    else:
        _count("AllGather" if output is None else "AllGatherOut")
    result = _all_gather_one(value, dim, groups)
    if output is not None:
        _into_output(output, result)
        return output
    return result


def _reduce_scatter_one(
    reduce_type: str,
    value: torch.Tensor,
    scale: float,
    scatter_dim: int,
    shard_count: int,
    groups: Any,
) -> torch.Tensor:
    rows, index, size = _replica_rows(value, groups, "reduce_scatter")
    if shard_count != size:
        raise RuntimeError(
            f"xm.reduce_scatter: shard_count ({shard_count}) must be the number of replicas "
            f"taking part ({size})"
        )
    reduced = _reduce(reduce_type, rows)
    if value.shape[scatter_dim] % shard_count:
        raise RuntimeError(
            f"xm.reduce_scatter: dimension {scatter_dim} of size {value.shape[scatter_dim]} "
            f"does not split into {shard_count} equal shards"
        )
    shard = reduced.chunk(shard_count, dim=scatter_dim)[index]
    return shard * scale if scale != 1.0 else shard.clone()


def reduce_scatter(
    reduce_type: str,
    input: Any,  # noqa: A002
    scale: float,
    scatter_dim: int,
    shard_count: int,
    groups: Any = None,
    output: Any = None,
    pin_layout: bool = True,
    channel_id: Any = None,
    use_global_device_ids: Any = None,
) -> Any:
    """The reduction over the replicas, split along ``scatter_dim``: each keeps its shard."""
    if isinstance(input, torch.Tensor):
        _count("ReduceScatter" if output is None else "ReduceScatterOut")
        result = _reduce_scatter_one(reduce_type, input, scale, scatter_dim, shard_count, groups)
        if output is not None:
            _into_output(output, result)
            return output
        return result
    if not (isinstance(input, list) and all(isinstance(v, torch.Tensor) for v in input)):
        raise TypeError(
            f"`input` needs to be a Tensor or a list of Tensors, but given {type(input)}."
        )
    results = [
        _reduce_scatter_one(reduce_type, v, scale, scatter_dim, shard_count, groups) for v in input
    ]
    if output is None:
        return results
    if not isinstance(output, list) or any(not isinstance(v, torch.Tensor) for v in output):
        raise TypeError(f"`output` needs to be a list of Tensors, but given {type(output)}.")
    if len(output) != len(input):
        raise ValueError(
            f"`output` length doesn't match `input` length: {len(output)} vs {len(input)}."
        )
    for out, result in zip(output, results, strict=True):
        _into_output(out, result)
    return output


def _tensor_list_or_raise(value: Any, name: str) -> None:
    if not isinstance(value, list) or any(not isinstance(v, torch.Tensor) for v in value):
        raise TypeError(f"`{name}` needs to be a list of Tensors, but given {type(value)}.")


class CoalescingBuckets:
    """Runs ``func`` over ``input_list`` in buckets of about ``bucket_cap_mb`` MiB each: a
    bucket of one tensor as ``func(tensor, output)``, a larger one as ``func(tensors,
    outputs)`` (the coalesced collective); calling it returns every result in input order."""

    def __init__(
        self,
        func: Callable[[Any, Any], Any],
        input_list: Any,
        output_list: Any = None,
        bucket_cap_mb: int = 160,
    ) -> None:
        _tensor_list_or_raise(input_list, "input_list")
        if output_list is not None:
            _tensor_list_or_raise(output_list, "output_list")
            if len(output_list) != len(input_list):
                raise ValueError(
                    "`output_list` length doesn't match `input_list` length: "
                    f"{len(output_list)} vs {len(input_list)}."
                )
        self._func = func
        self._input_list = input_list
        self._output_list = output_list
        self._bucket_cap = bucket_cap_mb * 1024 * 1024

    def _buckets(self) -> list[list[int]]:
        """The input indices of each bucket. A tensor over the cap joins a bucket under half
        the cap when both stay within twice the cap, and that bucket closes with it;
        otherwise a bucket closes before the tensor that would take it over the cap."""
        cap = self._bucket_cap
        buckets: list[list[int]] = []
        current: list[int] = []
        filled = 0
        for index, tensor in enumerate(self._input_list):
            size = tensor.numel() * tensor.element_size()
            if size > cap and filled < cap / 2 and filled + size <= 2 * cap:
                buckets.append([*current, index])
                current, filled = [], 0
                continue
            if filled + size > cap:
                buckets.append(current)
                current, filled = [], 0
            current.append(index)
            filled += size
        buckets.append(current)
        return [b for b in buckets if b]

    def __call__(self) -> list[Any]:
        results: list[Any] = []
        for bucket in self._buckets():
            inputs = [self._input_list[i] for i in bucket]
            outputs = None if not self._output_list else [self._output_list[i] for i in bucket]
            if len(bucket) == 1:
                results.append(self._func(inputs[0], outputs[0] if outputs else None))
            else:
                results.extend(self._func(inputs, outputs))
        return results


def all_gather_bucketized(
    input_list: list[torch.Tensor],
    dim: int = 0,
    groups: list[list[int]] | None = None,
    output: Any = None,
    pin_layout: bool = False,
    bucket_cap_mb: int = 160,
) -> list[torch.Tensor]:
    """``all_gather`` of each tensor, coalesced in buckets of about ``bucket_cap_mb`` MiB."""
    if pin_layout:
        raise RuntimeError("For xm.all_gather_bucketized, pin_layout=True is not yet supported.")

    def gather(values: Any, outputs: Any) -> Any:
        return all_gather(values, dim=dim, groups=groups, output=outputs, pin_layout=pin_layout)

    return CoalescingBuckets(gather, input_list, output, bucket_cap_mb=bucket_cap_mb)()


def reduce_scatter_bucketized(
    reduce_type: str,
    input_list: Any,
    scale: float,
    scatter_dim: int,
    shard_count: int,
    groups: list[list[int]] | None = None,
    output: Any = None,
    pin_layout: bool = False,
    bucket_cap_mb: int = 160,
) -> list[torch.Tensor]:
    """``reduce_scatter`` of each tensor, coalesced in buckets of about ``bucket_cap_mb``
    MiB."""

    def scatter(values: Any, outputs: Any) -> Any:
        return reduce_scatter(
            reduce_type, values, scale, scatter_dim, shard_count,
            groups=groups, output=outputs, pin_layout=pin_layout,
        )  # fmt: skip

    return CoalescingBuckets(scatter, input_list, output, bucket_cap_mb=bucket_cap_mb)()


def all_reduce_bucketized_gradients(
    gradients: list[torch.Tensor],
    scale: float,
    groups: list[list[int]] | None,
    pin_layout: bool,
    bucket_cap_mb: int = 0,
) -> None:
    """In-place sum of the gradients over the replicas (times ``scale``), one all-reduce per
    bucket of about ``bucket_cap_mb`` MiB (a bucket holds at least one gradient)."""
    cap = bucket_cap_mb * 1024 * 1024
    bucket: list[torch.Tensor] = []
    filled = 0
    for grad in gradients:
        size = grad.numel() * grad.element_size()
        if bucket and filled + size > cap:
            all_reduce(REDUCE_SUM, bucket, scale=scale, groups=groups, pin_layout=pin_layout)
            bucket, filled = [], 0
        bucket.append(grad)
        filled += size
    if bucket:
        all_reduce(REDUCE_SUM, bucket, scale=scale, groups=groups, pin_layout=pin_layout)


def all_to_all(
    value: torch.Tensor,
    split_dimension: int,
    concat_dimension: int,
    split_count: int,
    groups: Any = None,
    pin_layout: bool = True,
) -> torch.Tensor:
    """Each replica's ``value`` split in ``split_count`` pieces along ``split_dimension``;
    replica ``i`` gets every replica's ``i``-th piece, concatenated along
    ``concat_dimension`` in replica order."""
    _count("AllToAll")
    return _all_to_all_one(value, split_dimension, concat_dimension, split_count, groups)


def _all_to_all_one(
    value: torch.Tensor, split_dimension: int, concat_dimension: int, split_count: int, groups: Any
) -> torch.Tensor:
    rows, index, size = _replica_rows(value, groups, "all_to_all")
    if split_count != size:
        raise RuntimeError(
            f"xm.all_to_all: split_count ({split_count}) must be the number of replicas "
            f"taking part ({size})"
        )
    if value.shape[split_dimension] % split_count:
        raise RuntimeError(
            f"xm.all_to_all: dimension {split_dimension} of size "
            f"{value.shape[split_dimension]} does not split into {split_count} equal pieces"
        )
    pieces = [row.chunk(split_count, dim=split_dimension)[index] for row in rows.unbind(0)]
    return torch.cat(pieces, dim=concat_dimension)


def collective_permute(value: torch.Tensor, pairs: list[list[int]]) -> torch.Tensor:
    """XLA's CollectivePermute: each ``[source, target]`` pair sends the source replica's
    ``value`` to the target; a replica no pair targets gets zeros."""
    rows, index, _ = _replica_rows(value, None, "collective_permute")
    sources = [source for source, target in pairs if target == index]
    if len(sources) > 1:
        raise RuntimeError(
            f"xm.collective_permute: replica {index} is the target of several pairs {pairs}"
        )
    if not sources:
        return torch.zeros_like(value)
    return rows[sources[0]].clone()


def _whole_group(size: int) -> list[list[int]]:
    return [list(range(size))]


def _functional_all_reduce(value: torch.Tensor, reduce_op: str, group_name: str) -> torch.Tensor:
    # torch_xla reduces over every replica whatever the group, with no scale.
    _count("all_reduce")
    if reduce_op not in _REDUCERS:
        raise RuntimeError(f"Unknown AllReduce type: {reduce_op}")
    return _all_reduce_one(reduce_op, value, 1.0, None)


def _functional_all_gather(value: torch.Tensor, group_size: int, group_name: str) -> torch.Tensor:
    _count("all_gather_into_tensor")
    return _all_gather_one(value, 0, _whole_group(group_size))


def _functional_reduce_scatter(
    value: torch.Tensor, reduce_op: str, group_size: int, group_name: str
) -> torch.Tensor:
    # The scatter dim is always 0: the op's signature has none.
    _count("reduce_scatter_tensor")
    if reduce_op not in _REDUCERS:
        raise ValueError(f"Invalid string for AllReduceType: {reduce_op}")
    return _reduce_scatter_one(reduce_op, value, 1.0, 0, group_size, _whole_group(group_size))


def _functional_all_to_all(
    value: torch.Tensor,
    output_split_sizes: list[int],
    input_split_sizes: list[int],
    group_name: str,
) -> torch.Tensor:
    # torch_xla splits dim 0 evenly over every device of the slice.
    _count("all_to_all_single")
    split_count = runtime.global_runtime_device_count()
    if output_split_sizes and input_split_sizes:
        even = value.shape[0] // split_count
        if any(s != even for s in [*input_split_sizes, *output_split_sizes]):
            raise RuntimeError("torch_xla does not support arbitrary split sizes for all_to_all")
    return _all_to_all_one(value, 0, 0, split_count, _whole_group(split_count))


_functional_collectives.set_kernel("all_reduce", _functional_all_reduce)
_functional_collectives.set_kernel("all_gather_into_tensor", _functional_all_gather)
_functional_collectives.set_kernel("reduce_scatter_tensor", _functional_reduce_scatter)
_functional_collectives.set_kernel("all_to_all_single", _functional_all_to_all)


def _point_to_point(name: str) -> NotImplementedError:
    return NotImplementedError(
        f"xlasim does not simulate xm.{name}: XLA's {name.capitalize()} pairs ops of "
        "different programs by channel id, and the simulated replicas exchange values only "
        "through collectives every replica runs; use xm.collective_permute"
    )


def send(value: torch.Tensor, channel_id: int) -> torch.Tensor:
    raise _point_to_point("send")


def recv(output: torch.Tensor, channel_id: int) -> torch.Tensor:
    raise _point_to_point("recv")


def collective_broadcast(
    tensors: list[torch.Tensor], root_ordinal: int = 0, groups: Any = None, pin_layout: bool = True
) -> None:
    """The root replica's values into every replica's ``tensors``, in place."""
    with torch.no_grad():
        # Every replica runs the same ops (a product with 1 on the root, 0 elsewhere, then a
        # sum over the replicas), as torch_xla builds it.
        for tensor in tensors:
            keep = torch.tensor(
                1 if runtime.global_ordinal() == root_ordinal else 0, dtype=tensor.dtype
            )
            tensor.mul_(send_cpu_data_to_device(keep, tensor.device)[0])
    all_reduce(REDUCE_SUM, tensors, groups=groups, pin_layout=pin_layout)


class RateTracker:
    """Items per second: ``rate()`` since the previous call (exponentially smoothed with
    ``RATE_TRACKER_SMOOTHING``, default 0.4), ``global_rate()`` since creation."""

    def __init__(self, smooth_factor: float | None = None) -> None:
        self._smooth_factor = (
            xu.getenv_as("RATE_TRACKER_SMOOTHING", float, 0.4)
            if smooth_factor is None
            else smooth_factor
        )
        self._start_time = time.time()
        self._partial_time = self._start_time
        self._partial_count = 0.0
        self._partial_rate: float | None = None
        self._count = 0.0

    def add(self, count: float) -> None:
        self._count += count

    def rate(self) -> float:
        now = time.time()
        elapsed = now - self._partial_time
        if elapsed <= 0:
            return 0.0
        current = self._count / elapsed
        previous = self._partial_rate
        if previous is not None:
            current = (1 - self._smooth_factor) * current + self._smooth_factor * previous
        self._partial_count += self._count
        self._count = 0.0
        self._partial_time = now
        self._partial_rate = current
        return current

    def global_rate(self) -> float:
        elapsed = time.time() - self._start_time
        return (self._partial_count + self._count) / elapsed if elapsed > 0 else 0.0


def add_step_closure(
    closure: Callable[..., Any], args: tuple[Any, ...] = (), run_async: bool = False
) -> None:
    """Queues ``closure(*args)`` to run after the next sync, once its tensors are computed;
    with ``run_async`` on a worker thread (torch_xla.utils.closures.AsyncClosureHandler)."""
    queue = _runtime.current().step_closures
    queue.append((run_async, closure, tuple(args)))


def _run_step_closures() -> DeviceContext:
    sim = _runtime.current()
    queued, sim.step_closures = sim.step_closures, []
    # The asynchronous closures are handed to the worker first, as torch_xla does.
    started = [functools.partial(c, *args) for is_async, c, args in queued if is_async]
    if started:
        if sim.async_closures is None:
            sim.async_closures = xc.AsyncClosureHandler()
        sim.async_closures.run_all(started)
    for is_async, closure, args in queued:
        if not is_async:
            closure(*args)
    return _get_device_context()


@deprecated("Use torch_xla.sync instead")
def mark_step(wait: bool = False, reset_scope: bool = True) -> None:
    torch_xla.sync(wait, reset_scope)


def wait_device_ops(devices: list[str] = []) -> None:  # noqa: B006 - the real signature
    """Simulated execution is synchronous: nothing is ever in flight to wait for."""


def reduce_gradients(
    optimizer: optim.Optimizer, groups: list[list[int]] | None = None, pin_layout: bool = True
) -> None:
    count = runtime.world_size()
    if count <= 1:
        return
    gradients = _fetch_gradients(optimizer)
    bucket_mb = int(os.environ.get("ALLREDUCE_GRADIENTS_BUCKET_SIZE_MB", "0"))
    if bucket_mb > 0:
        # Buckets from the last layer back, the order backward produces gradients in.
        all_reduce_bucketized_gradients(
            gradients[::-1], 1.0 / count, groups, pin_layout, bucket_cap_mb=bucket_mb
        )
        return
    all_reduce(REDUCE_SUM, gradients, scale=1.0 / count, groups=groups, pin_layout=pin_layout)


def optimizer_step(
    optimizer: optim.Optimizer,
    barrier: bool = False,
    optimizer_args: dict[str, Any] = {},  # noqa: B006 - the real signature
    groups: list[list[int]] | None = None,
    pin_layout: bool = True,
) -> Any:
    """Averages the gradients over the replicas, then ``optimizer.step(**optimizer_args)``,
    then a sync when ``barrier`` is set."""
    reduce_gradients(optimizer, groups=groups, pin_layout=pin_layout)
    result = optimizer.step(**optimizer_args)
    if barrier:
        torch_xla.sync()
    return result


def _maybe_convert_to_cpu(data: Any, convert: bool = True) -> Any:
    def convert_one(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.device.type == "xla":
            return value.cpu() if convert else value
        if isinstance(value, dict):
            return type(value)((k, convert_one(v)) for k, v in value.items())
        if isinstance(value, (list, tuple)):
            items = [convert_one(v) for v in value]
            return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
        return value

    tensors = []
    torch.utils._pytree.tree_map(
        lambda v: tensors.append(v) if isinstance(v, _tensor.XlaSimTensor) else None, data
    )
    torch_xla._XLAC._xla_sync_multi(tensors, devices=[], wait=True, sync_xla_data=False)
    return convert_one(data)


def save(
    data: Any, file_or_path: Any, master_only: bool = True, global_master: bool = False
) -> None:
    if master_only and not is_master_ordinal(local=not global_master):
        # Not the writer, but every process still computes the tensors (as in torch_xla).
        _maybe_convert_to_cpu(data, convert=False)
        return
    torch.save(_maybe_convert_to_cpu(data), file_or_path)


def xla_rendezvous(
    payload: bytes = b"", ordinals: list[int] | None = None, tag: str | None = None
) -> list[bytes]:
    if ordinals and len(ordinals) != runtime.global_device_count():
        raise ValueError("Only global rendezvous is supported")
    if not isinstance(payload, bytes):
        raise TypeError(f"`payload` must be bytes, not {type(payload)}")
    torch_xla.sync()
    if runtime.world_size() == 1:
        return [payload]
    # The payloads travel as device data: sizes first, then every payload padded to the
    # longest, both gathered over the replicas.
    device = torch_xla.device()
    data = torch.tensor(list(payload), dtype=torch.uint8)
    sizes = all_gather(torch.tensor([data.shape[0]], dtype=torch.int, device=device))
    longest = int(torch.max(sizes).item())
    torch_xla.sync()
    if longest < 1:
        return [b"" for _ in range(sizes.size()[0])]
    padded = torch.nn.functional.pad(data, (0, longest - data.shape[0])).to(device)
    pieces = torch.split(all_gather(padded), longest)
    payloads = [p[:n] for p, n in zip(pieces, sizes.cpu().tolist(), strict=True)]
    torch_xla.sync()
    return [bytes(p.cpu().tolist()) for p in payloads]


def rendezvous(tag: str, payload: bytes = b"", replicas: list[int] = []) -> list[bytes]:  # noqa: B006 - the real signature
    return xla_rendezvous(payload, replicas or None, tag=tag)


def _serialized(value: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def mesh_reduce(tag: str, data: Any, reduce_fn: Callable[..., Any]) -> Any:
    """``reduce_fn`` over every replica's ``data`` (CPU copies), exchanged at a rendezvous."""
    local = _maybe_convert_to_cpu(data)
    payloads = rendezvous(tag, _serialized(local))
    if not payloads:
        return local
    return reduce_fn([torch.load(io.BytesIO(p)) for p in payloads])


def do_on_ordinals(target: Callable[..., Any], data: Any = (), ordinals: Any = (0,)) -> Any:
    """``target(*data)`` on the given global ordinals; every process meets at a rendezvous."""
    if runtime.global_ordinal() in ordinals:
        result = target(*_maybe_convert_to_cpu(data))
    else:
        _maybe_convert_to_cpu(data, convert=False)  # the others still compute the tensors
        result = None
    rendezvous("torch_xla.core.xla_model.do_on_ordinals")
    return result


# One generator serves the whole simulated slice, so ``device`` selects nothing.
def set_rng_state(seed: int, device: str | None = None) -> None:
    _runtime.current().manual_seed(seed)


def get_rng_state(device: str | None = None) -> int:
    return _runtime.current().rng_seed


@contextlib.contextmanager
def fork_rng(device: str | None = None, enabled: bool = True) -> Iterator[None]:
    """Puts the RNG back to the state it had on entry when the block ends (``enabled=False``:
    leaves it alone)."""
    if not enabled:
        yield
        return
    state = get_rng_state(device)
    try:
        yield
    finally:
        set_rng_state(state, device)


class MemoryInfo(TypedDict):
    bytes_used: str
    bytes_limit: int


def get_memory_info(device: torch.device | None = None) -> MemoryInfo:
    if device is None:
        device = xla_device()
    if runtime.is_spmd():
        raise RuntimeError(
            "Check failed: device != spmd_device_str (SPMD:0 vs. SPMD:0)"
            "MemoryInfo not supported for SPMD virtual device."
        )
    return _memory.device_memory_info(torch.device(device))  # type: ignore[return-value]


def _pending_stablehlo(tensors: list[torch.Tensor] | None) -> Any:
    """The pending graph of ``tensors`` (default: every live tensor with a pending value)
    lowered to StableHLO by jax (the tpu-compiler extra), its inputs in torch_xla's order."""
    lowering = tpu_compiler_layer(
        "xlasim.runtime.compiler.stablehlo",
        "xlasim: the StableHLO of pending tensors comes from jax's lowering of their graph",
    )
    if tensors is None:
        live = (ref() for ref in _runtime.current().graphs.pending)
        tensors = list({id(t): t for t in live if t is not None and t._node is not None}.values())
    module, inputs = _pending_fx.pending_graph(tensors, _tensor.leaf_input)
    return lowering.lower_graph(module, {}, list(range(len(inputs))), inputs)


def get_stablehlo(tensors: list[torch.Tensor] | None = None) -> str:
    return _pending_stablehlo(tensors).text


def get_stablehlo_bytecode(tensors: list[torch.Tensor] | None = None) -> bytes:
    return _pending_stablehlo(tensors).bytecode


def optimization_barrier_(tensors: list[torch.Tensor]) -> None:
    """The barrier is an IR node over the tensors (simulated graphs are never fused across
    it, so it changes no value)."""
    torch_xla._XLAC._xla_optimization_barrier_(tensors)


def broadcast_master_param(model: torch.nn.Module) -> None:
    """Every replica takes replica 0's parameters and buffers."""
    collective_broadcast([*model.parameters(), *model.buffers()])
    torch_xla.sync()


class ToXlaTensorArena:
    """Converts, in one ``convert_fn`` call, every object ``select_fn`` picks anywhere in a nest
    of containers and objects (``xu.for_each_instance``), then rebuilds the nest around the
    results (``xu.for_each_instance_rewrite``: tuples come back as lists)."""

    def __init__(
        self,
        convert_fn: Callable[[list[torch.Tensor]], list[torch.Tensor]],
        select_fn: Callable[[torch.Tensor], bool],
    ) -> None:
        self._convert_fn = convert_fn
        self._select_fn = select_fn

    def transform(self, inputs: Any) -> Any:
        found: list[Any] = []
        xu.for_each_instance(inputs, self._select_fn, found.append)
        converted = self._convert_fn(found) if found else []
        by_id = {id(t): c for t, c in zip(found, converted, strict=True)}
        return xu.for_each_instance_rewrite(inputs, self._select_fn, lambda t: by_id[id(t)])


def _input_shardings(tensors: list[torch.Tensor], input_sharding: Any) -> list[Any] | None:
    """Each tensor's XlaShardingSpec (None where the spec does not fit it), or None."""
    if not input_sharding:
        return None
    shardings = [input_sharding.xla_spec(t) for t in tensors]
    if input_sharding.minibatch:
        # A host's part of the batch is cut into one equal piece per local device (dim 0).
        per_host = runtime.addressable_runtime_device_count()
        for tensor, sharding in zip(tensors, shardings, strict=True):
            if sharding is not None and tensor.dim() > 0 and tensor.shape[0] % per_host:
                raise RuntimeError(
                    "When minibatch is configured, the per-host batch size must be divisible "
                    f"by local runtime device count. Per host input data shape = {tensor.size()}, "
                    f"local_runtime_device_count = {per_host}"
                )
    return shardings


def send_cpu_data_to_device(datas: Any, device: Any, input_sharding: Any = None) -> Any:
    """Moves every CPU tensor in ``datas`` to ``device`` in one transfer, as torch_xla does
    (a lone tensor comes back in a list, as it does from torch_xla)."""
    leaves, structure = torch.utils._pytree.tree_flatten(
        [datas] if type(datas) is torch.Tensor else datas
    )
    slots: list[tuple[list[Any], int]] = []
    wrapped: list[tuple[list[Any], int, Any, list[Any], Any]] = []
    _gather_cpu_tensors(leaves, slots, wrapped)
    if slots:
        tensors = [where[i] for where, i in slots]
        shardings = _input_shardings(tensors, input_sharding)
        targets = [str(device)] * len(tensors)
        moved = torch_xla._XLAC._xla_tensors_from_aten(tensors, targets, shardings)
        for (where, i), tensor in zip(slots, moved, strict=True):
            where[i] = tensor
    # Inner wrappers come first in ``wrapped``: an outer one is rebuilt around rebuilt ones.
    for where, i, wrapper, inner, spec in wrapped:
        where[i] = wrapper.from_tensors(torch.utils._pytree.tree_unflatten(inner, spec))
    return torch.utils._pytree.tree_unflatten(leaves, structure)


def _gather_cpu_tensors(
    leaves: list[Any],
    slots: list[tuple[list[Any], int]],
    wrapped: list[tuple[list[Any], int, Any, list[Any], Any]],
) -> None:
    """The places of the CPU tensors to move among ``leaves``: plain CPU tensors only
    (subclasses and device tensors stay where they are), those a ``DataWrapper`` hands over
    included; the wrappers, to rebuild around the moved tensors."""
    for i, v in enumerate(leaves):
        if type(v) is torch.Tensor and v.device.type == "cpu":
            slots.append((leaves, i))
        elif isinstance(v, xu.DataWrapper):
            inner, spec = torch.utils._pytree.tree_flatten(v.get_tensors())
            _gather_cpu_tensors(inner, slots, wrapped)
            wrapped.append((leaves, i, v, inner, spec))
