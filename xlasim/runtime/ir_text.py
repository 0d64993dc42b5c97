"""``_get_xla_tensors_text``: torch_xla's text of the IR graph behind the given tensors.

Measured on torch_xla 2.9 (CPU) for tensors that hold data (moved to the device, or computed
by an earlier graph): each tensor is one ``xla::device_data`` node, numbered in the order the
tensors are given, a tensor given twice once, its ``ROOT`` the last position it was given at.
An empty list gives an empty graph. The text of a pending op's node depends on torch_xla's IR
lowering (its scalar constants, view ops and random-number ops), which the simulator does not
reproduce; it raises NotImplementedError, as does data carrying an SPMD sharding.
"""

from __future__ import annotations

from typing import Any

from xlasim.runtime.debug_info import layout
from xlasim.runtime.errors import xla_type


def _unsupported(what: str) -> NotImplementedError:
    return NotImplementedError(
        f"xlasim does not simulate the IR text of {what} (torch_xla._XLAC._get_xla_tensors_text)"
    )


def tensors_ir_text(rt: Any, tensors: list[Any]) -> str:
    roots: dict[int, tuple[Any, int]] = {}
    for position, t in enumerate(tensors):
        if t._node is not None:
            raise _unsupported(f"a pending op's IR node (the result of {t._node.op})")
        if rt.spmd and t._sharding is not None:
            raise _unsupported("sharded device data")
        first = roots.get(id(t))
        roots[id(t)] = (t, position) if first is None else (first[0], position)
    lines = ["IR {"]
    for number, (t, root) in enumerate(roots.values()):
        shape = f"{xla_type(t.dtype)}[{','.join(map(str, t.shape))}]{layout(t)}"
        lines.append(f"  %{number} = {shape} xla::device_data(), xla_shape={shape}, ROOT={root}")
    return "\n".join(lines) + "\n}\n"
