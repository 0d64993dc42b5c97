"""``_get_xla_tensor_debug_info``: torch_xla's text dump of one device tensor's state.

The simulator writes it for the states whose text it knows exactly (read from torch_xla 2.9):
data still on the host (SPMD's deferred upload), and data just moved from the host, which
torch_xla holds as a ``device_data`` IR value until the next step barrier. What a pending op's
IR node prints, and how a sync rewrites a tensor's state, depend on torch_xla's IR lowering,
which the simulator does not reproduce: those states raise ``NotImplementedError``.
"""

from __future__ import annotations

from typing import Any

from xlasim.runtime.errors import xla_shape


def _layout(t: Any) -> str:
    # XLA's default layout: minor-to-major, the last dimension fastest; none for a scalar.
    return "{" + ",".join(str(d) for d in reversed(range(t.dim()))) + "}" if t.dim() else ""


def tensor_debug_info(rt: Any, t: Any) -> str:
    """The text torch_xla 2.9 returns for ``t``, or NotImplementedError naming the state."""
    if t._node is not None:
        raise NotImplementedError(
            "xlasim does not simulate the IR text of a pending op "
            f"(torch_xla._XLAC._get_xla_tensor_debug_info of the result of {t._node.op})"
        )
    if not t._on_host and (t._uploaded_at is None or t._uploaded_at != rt.step_barriers):
        raise NotImplementedError(
            "xlasim does not simulate the debug text (torch_xla._XLAC._get_xla_tensor_debug_info)"
            " of a tensor computed by a graph or passed through a step barrier"
        )
    device = "SPMD:0" if rt.spmd else rt.real_devices()[t._device.index or 0]
    shape = xla_shape(t)
    sharding = t._sharding
    lines = [
        "XLATensor {",
        f"TensorID: {t._seq}",
        f"AliasID: {t._seq}",
        f"Device: {device}",
        f"XLA Shape: {shape}",
        f"ShardingSpec: {sharding.spec_string() if sharding is not None else 'None'}",
    ]
    if t._on_host:
        lines += ["IR: None", "XLAData: None", f"Tensor on host: with size {list(t.shape)}"]
    else:
        lines.append(
            f"IR: [UNKNOWN_SCALAR[]] xla::device_data, xla_shape={shape}{_layout(t)}, "
            f"dynamic_dims: (), device={device}"
        )
        if rt.spmd and sharding is not None:
            lines += [
                "XLAShardedData: ",
                f"  Data Device: {device}",
                f"  Data Shape: {shape}",
                f"  OpSharding: {sharding.spec_string()}",
                f"  NumShards: {len(rt.addressable_device_ids())}",
            ]
        else:
            lines.append("XLAData: None")
        lines.append("Tensor on host: None")
    return "\n".join(lines) + "\n}\n"
