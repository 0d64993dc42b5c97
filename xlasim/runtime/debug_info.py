"""``_get_xla_tensor_debug_info``: torch_xla's text dump of one device tensor's state.

The simulator writes it for the states whose text it knows (read from torch_xla 2.9): data
still on the host (SPMD's deferred upload); data moved from the host, which torch_xla holds
as a ``device_data`` IR value (outside SPMD until the next step barrier, after which it is
plain device data; under SPMD for as long as the moved data carries a sharding); and the
outputs of an executed graph. What a pending op's IR node prints depends on torch_xla's IR
lowering; the simulator writes it for the few ops whose node it measured (elementwise
arithmetic, sin, view_as_real/view_as_complex outside SPMD). Other ops' nodes and the few
states whose text was not measured raise ``NotImplementedError``. TensorID/AliasID are the
simulator's own numbering (torch_xla counts every tensor object its C++ makes, in-place
results included).
"""

from __future__ import annotations

from typing import Any

import torch

from xlasim.runtime import legacy_long
from xlasim.runtime.errors import xla_shape, xla_type
from xlasim.runtime.tensor import leaf_input

aten = torch.ops.aten


def _layout(t: Any) -> str:
    # XLA's default layout: minor-to-major, the last dimension fastest; none for a scalar.
    return "{" + ",".join(str(d) for d in reversed(range(t.dim()))) + "}" if t.dim() else ""


def _default_layout(rank: int) -> str:
    return "{" + ",".join(str(d) for d in reversed(range(rank))) + "}" if rank else ""


_VIEW_AS_REAL = aten.view_as_real.default
# The IR node torch_xla makes for an op's result (functionalization turns views into copies),
# for the ops whose debug text was measured on torch_xla 2.9.
_PENDING_IR_NAMES = {
    aten.add.Tensor: "aten::add",
    aten.sub.Tensor: "aten::sub",
    aten.mul.Tensor: "aten::mul",
    aten.div.Tensor: "aten::div",
    aten.pow.Tensor_Scalar: "aten::pow",
    aten.sin.default: "aten::sin",
    # torch.randn / torch.rand on the device: a factory filled in place by these.
    aten.normal_.default: "aten::normal",
    aten.uniform_.default: "aten::uniform",
    aten.view_as_complex.default: "aten::view_as_complex_copy",
    _VIEW_AS_REAL: "aten::view_as_real_copy",
}


def _unknown(what: str) -> NotImplementedError:
    return NotImplementedError(
        f"xlasim does not simulate the debug text of {what} "
        "(torch_xla._XLAC._get_xla_tensor_debug_info)"
    )


def _barrier_uploaded(rt: Any, t: Any) -> bool:
    """SPMD data a step barrier uploaded (replicated) while it still waited on the host for
    its first use: torch_xla keeps both the sharded data and the host copy."""
    if not rt.spmd or t._moved_at is None:
        return False
    return t._moved_at != (rt.step_barriers if t._on_host else t._uploaded_at)


def only_on_host(rt: Any, t: Any) -> bool:
    """SPMD data still waiting on the host, with no device buffer yet (no step barrier has
    uploaded it)."""
    return bool(t._on_host) and not t._computed and not _barrier_uploaded(rt, t)


def _ir_line(rt: Any, t: Any, device: str, shape: str) -> str:
    """The tensor's IR value: None once it is plain device data."""
    if t._on_host or t._computed:
        return "IR: None"
    if t._uploaded_at is None:
        raise _unknown(
            "a tensor made on the device (factory functions, loaded shards) or data under "
            "annotate_custom_sharding"
        )
    if rt.spmd:
        if t._sharding is None and t._uploaded_at != rt.step_barriers and t._moved_at is None:
            # torch_xla's barrier gives the replicated upload a sharding of its own.
            raise _unknown("an SPMD tensor uploaded at its first use, after a step barrier")
    elif t._uploaded_at != rt.step_barriers:
        return "IR: None"  # the barrier turned the device_data value into plain data
    return (
        f"IR: [UNKNOWN_SCALAR[]] xla::device_data, xla_shape={shape}{_layout(t)}, "
        f"dynamic_dims: (), device={device}"
    )


def _sharded_data_lines(rt: Any, spec: str, device: str, shape: str) -> list[str]:
    return [
        "XLAShardedData: ",
        f"  Data Device: {device}",
        f"  Data Shape: {shape}",
        f"  OpSharding: {spec}",
        f"  NumShards: {len(rt.addressable_device_ids())}",
    ]


def holds_data_ir(rt: Any, t: Any) -> bool:
    """Whether torch_xla holds ``t`` as a ``device_data`` IR value (not plain data, not a
    pending op); NotImplementedError for the states whose IR the simulator does not know."""
    if t._node is not None:
        raise _unknown(f"a pending op's IR node (the result of {t._node.op})")
    device = "SPMD:0" if rt.spmd else rt.real_devices()[t._device.index or 0]
    return _ir_line(rt, t, device, xla_shape(t)) != "IR: None"


def layout(t: Any) -> str:
    """XLA's default layout of ``t`` as HLO text writes it after the shape."""
    return _layout(t)


def _data_lines(rt: Any, t: Any, ir: str, device: str, shape: str) -> list[str]:
    sharding = t._sharding
    if _barrier_uploaded(rt, t):
        return _sharded_data_lines(rt, "{replicated}", device, shape)
    if t._spec_on_ir:
        return ["XLAData: None"]  # the spec is on the device_data IR value, no data sharded yet
    if rt.spmd and sharding is not None:
        return _sharded_data_lines(rt, sharding.spec_string(), device, shape)
    if t._on_host or ir != "IR: None":
        return ["XLAData: None"]  # held by the host, or by the device_data IR value
    if rt.spmd:
        raise _unknown("an SPMD graph output without a sharding")
    return [
        "XLAData: ",
        f"  Data Device: {device}",
        f"  Data Shape: {shape}",
        # an opaque number, stable while the data is
        "  Data Handle: Deleted"
        if t._node is None and rt.graphs.donors.deleted_on(leaf_input(t)) is not None
        else "  Data Handle: None"
        if t._buf is not None and t._buf.cleared
        else f"  Data Handle: {id(t._elem)}",
    ]


def _pending_ir_line(rt: Any, t: Any, shape: str) -> str:
    """A pending op's IR node: its torch_xla op name and shape, for the ops measured."""
    op = t._node.op
    name = _PENDING_IR_NAMES.get(op)
    if name is None or rt.spmd or t._sharding is not None:
        raise _unknown(f"a pending op's IR node (the result of {op})")
    # view_as_real's node keeps its operand's layout, one dimension short (as measured).
    layout = _layout(t) if op is not _VIEW_AS_REAL else _default_layout(t.dim() - 1)
    return f"IR: [] {name}, xla_shape={shape}{layout}, dynamic_dims: ()"


def tensor_debug_info(rt: Any, t: Any) -> str:
    """The text torch_xla 2.9 returns for ``t``, or NotImplementedError naming the state."""
    device = "SPMD:0" if rt.spmd else rt.real_devices()[t._device.index or 0]
    shape = xla_shape(t)
    if rt.long_storage and t.dtype in legacy_long.LONG_DTYPES:  # the type the device holds
        shape = xla_type(legacy_long.stored_dtype(t.dtype, True)) + shape[shape.index("[") :]
    sharding = t._sharding
    if t._node is not None:
        ir = _pending_ir_line(rt, t, shape)
        data = ["XLAData: None"]  # nothing computed yet
    else:
        ir = _ir_line(rt, t, device, shape)
        data = _data_lines(rt, t, ir, device, shape)
    lines = [
        "XLATensor {",
        f"TensorID: {t._seq}",
        f"AliasID: {t._seq}",
        f"Device: {device}",
        f"XLA Shape: {shape}",
        f"ShardingSpec: {sharding.spec_string() if sharding is not None else 'None'}",
        ir,
        *data,
        f"Tensor on host: with size {list(t.shape)}"
        if t._on_host or _barrier_uploaded(rt, t)
        else "Tensor on host: None",
    ]
    return "\n".join(lines) + "\n}\n"
