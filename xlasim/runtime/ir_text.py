"""``_get_xla_tensors_text``: the IR of the given tensors' values, as torch_xla 2.9 prints it.

Measured on torch_xla 2.9 (CPU): one line per IR value, numbered ``%0, %1...`` as a depth-first
walk from each tensor in turn reaches them, an op's operands last to first, each operand
before its user; ``xla::device_data()`` for data, ``prim::Constant()`` for the ``alpha`` an
add or sub takes, the given tensors marked ``ROOT=<index>``. Written here for device data and
the elementwise add, sub, mul and div of tensors of one dtype; any other op, or a Python
number among the operands, raises NotImplementedError instead of inventing text.
"""

from __future__ import annotations

from typing import Any

import torch

from xlasim.runtime.errors import xla_type
from xlasim.runtime.graph import Node
from xlasim.runtime.tensor import XlaSimTensor, device_data_key

aten = torch.ops.aten
_WITH_ALPHA = {aten.add.Tensor: "aten::add", aten.sub.Tensor: "aten::sub"}
_PLAIN = {aten.mul.Tensor: "aten::mul", aten.div.Tensor: "aten::div"}


def _shape(dtype: torch.dtype, dims: tuple[int, ...]) -> str:
    text = f"{xla_type(dtype)}[{','.join(map(str, dims))}]"
    if dims:  # XLA's default layout, most minor dimension last
        text += "{" + ",".join(str(d) for d in reversed(range(len(dims)))) + "}"
    return text


class _Printer:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.ids: dict[int, tuple[int, torch.dtype]] = {}  # id(IR value) -> (number, dtype)

    def _emit(self, key: int, dtype: torch.dtype, shape: str, text: str) -> int:
        number = len(self.lines)
        self.ids[key] = (number, dtype)
        self.lines.append(f"  %{number} = {shape} {text}, xla_shape={shape}")
        return number

    def dtype(self, item: Any) -> torch.dtype:
        if not isinstance(item, Node):
            return item[1]
        a, b = (self.dtype(operand) for operand in item.inputs)
        return torch.promote_types(a, b)

    def value(self, item: Any) -> tuple[int, torch.dtype]:
        known = self.ids.get(id(item))
        if known is not None:
            return known
        if not isinstance(item, Node):  # a device-data key: (shape, dtype, sharding)
            self._emit(id(item), item[1], _shape(item[1], tuple(item[0])), "xla::device_data()")
            return self.ids[id(item)]
        name = _WITH_ALPHA.get(item.op) or _PLAIN.get(item.op)
        consts, kwargs = item.args if isinstance(item.args, tuple) else ((), {})
        alpha = (kwargs or {}).get("alpha", 1)
        if name is None or len(item.inputs) != 2 or list(consts) or alpha != 1:
            raise NotImplementedError(
                f"xlasim does not simulate the IR text of {item.op} with these operands "
                "(written: device data, and add/sub/mul/div of two tensors, alpha 1)"
            )
        dtype = self.dtype(item)
        numbers: dict[int, int] = {}
        if item.op in _WITH_ALPHA:  # the last operand: reached first
            numbers[2] = len(self.lines)
            scalar = _shape(dtype, ())
            self.lines.append(f"  %{numbers[2]} = {scalar} prim::Constant(), xla_shape={scalar}")
        for index in reversed(range(2)):
            numbers[index] = self.value(item.inputs[index])[0]
        args = ", ".join(f"%{numbers[i]}" for i in sorted(numbers))
        shape = _shape(dtype, tuple(item.shape or ()))
        return self._emit(id(item), dtype, shape, f"{name}({args})"), dtype


def tensors_text(tensors: list[XlaSimTensor]) -> str:
    printer = _Printer()
    roots: list[int] = []
    for t in tensors:
        item = t._node if t._node is not None else device_data_key(t)
        roots.append(printer.value(item)[0])
    lines = list(printer.lines)
    # A value given twice is written once, with the last position it was given at (as
    # torch_xla 2.9 writes it, measured on CPU).
    last = {number: index for index, number in enumerate(roots)}
    for number, index in last.items():
        lines[number] += f", ROOT={index}"
    return "IR {\n" + "".join(line + "\n" for line in lines) + "}\n"
