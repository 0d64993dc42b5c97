"""``_get_xla_tensors_hlo`` for the graphs whose HLO the simulator knows exactly.

torch_xla lowers the IR values of the given tensors into one HLO module: tensors it holds as
plain data (no IR value) are left out, and an empty list of values gives an empty text. A
tensor held as a ``device_data`` IR value (data just moved to the device, or sharded data
under SPMD) lowers to one ``parameter`` per distinct buffer, with its sharding under SPMD,
and the module returns them as a tuple; the instruction ids count up from 1 in that order
(parameters, tuple, module), as measured on torch_xla 2.9. The HLO of pending ops depends on
torch_xla's per-op lowering, which the simulator does not reproduce: it raises
NotImplementedError instead of inventing instructions.
"""

from __future__ import annotations

from typing import Any

from xlasim.runtime.debug_info import holds_data_ir, layout
from xlasim.runtime.errors import xla_shape
from xlasim.runtime.state import SimRuntime


def _hlo_unknown(t: Any) -> NotImplementedError:
    return NotImplementedError(
        f"xlasim does not simulate the HLO text of pending ops (this tensor is the result of "
        f"{t._node.op}): torch_xla's per-op lowering is not reproduced; only graphs of device "
        "data are written (torch_xla._XLAC._get_xla_tensors_hlo)"
    )


def tensors_hlo(rt: SimRuntime, tensors: list[Any]) -> str:
    params: list[Any] = []
    slot: dict[int, int] = {}
    outputs: list[int] = []
    for t in tensors:
        if t._node is not None:
            raise _hlo_unknown(t)
        if not holds_data_ir(rt, t):
            continue
        # Aliases of one buffer are one parameter.
        key = id(t._buf) if t._buf is not None else id(t)
        if key not in slot:
            slot[key] = len(params)
            params.append(t)
        outputs.append(slot[key])
    if not outputs:
        return ""
    n = len(params)
    module = f"IrToHlo.{n + 2}"
    full = [f"{xla_shape(t)}{layout(t)}" for t in params]
    bare = [xla_shape(t) for t in params]
    out_full = ", ".join(full[i] for i in outputs)
    lines = [
        f"HloModule {module}, entry_computation_layout={{({', '.join(full)})->({out_full})}}",
        "",
        f"ENTRY %{module} ({', '.join(f'p{i}.{i + 1}: {bare[i]}' for i in range(n))}) -> "
        f"({', '.join(bare[i] for i in outputs)}) {{",
    ]
    for i, t in enumerate(params):
        sharding = ""
        if rt.spmd:  # data uploaded without an annotation is replicated
            spec = t._sharding.spec_string() if t._sharding is not None else "{replicated}"
            sharding = f", sharding={spec}"
        lines.append(f"  %p{i}.{i + 1} = {full[i]} parameter({i}){sharding}")
    operands = ", ".join(f"{full[i]} %p{i}.{i + 1}" for i in outputs)
    lines.append(f"  ROOT %tuple.{n + 1} = ({out_full}) tuple({operands})")
    lines.append("}")
    return "\n".join(lines) + "\n\n"
