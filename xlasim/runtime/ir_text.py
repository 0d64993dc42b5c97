"""``_get_xla_tensors_text``: the IR of the given tensors' values, as torch_xla 2.9 prints it.

Measured on torch_xla 2.9 (CPU): one line per IR value, numbered ``%0, %1...`` as a depth-first
walk from each tensor in turn reaches them, an op's operands last to first, each operand
before its user; ``xla::device_data()`` for data, ``prim::Constant()`` for the ``alpha`` an
add or sub takes, the given tensors marked ``ROOT=<index>``. Written here for device data, the
elementwise add, sub, mul and div of tensors of one dtype, ``pow`` of a floating tensor by a
Python number (the number a ``prim::Constant()`` of the tensor's type, whatever its value) and
``floor_divide`` of floating tensors (an ``aten::div`` node, then an ``aten::floor`` one),
``addcdiv``/``addcmul`` of tensors of one dtype (their ``value`` an f64 or s64 number); any
other op, or a Python number among other ops' operands, raises NotImplementedError instead of
inventing text. With ``XLA_EXPERIMENTAL`` naming them, ``nonzero`` and ``masked_select`` are
nodes of two outputs (``(s32[<=6,1]{1,0}, s32[]) aten::nonzero(%0), num_outputs=2``), a
dynamic dimension written ``<=N``; an op on such a value is not written. Under
``XLA_USE_BF16``/``XLA_DOWNCAST_BF16``/``XLA_USE_32BIT_LONG`` a value
shows the type the device stores it in.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from xlasim.runtime import legacy_bf16, legacy_long
from xlasim.runtime.dynamic_dims import Bound
from xlasim.runtime.errors import xla_type
from xlasim.runtime.graph import Node
from xlasim.runtime.tensor import XlaSimTensor, device_data_key

aten = torch.ops.aten
_DYNAMIC = frozenset({aten.nonzero.default, aten.masked_select.default})
_WITH_ALPHA = {aten.add.Tensor: "aten::add", aten.sub.Tensor: "aten::sub"}
_PLAIN = {aten.mul.Tensor: "aten::mul", aten.div.Tensor: "aten::div"}
_ADDC = {aten.addcdiv.default: "aten::addcdiv", aten.addcmul.default: "aten::addcmul"}
_WRITTEN = "written: device data, add/sub/mul/div of two tensors with alpha 1, pow of a "
_WRITTEN += "floating tensor by a number, floor_divide of floating tensors, addcdiv/addcmul "
_WRITTEN += "of tensors of one dtype, nonzero and masked_select lowered with a dynamic "
_WRITTEN += "dimension (XLA_EXPERIMENTAL) but no op on them"
# Numbers torch_xla writes into the graph as constants rather than moving them as data.
_CONSTANT_NUMBERS = (0, 1, -1)


def _shape(dtype: torch.dtype, dims: tuple[int, ...]) -> str:
    text = f"{xla_type(dtype)}[{','.join(map(str, dims))}]"
    if dims:  # XLA's default layout, most minor dimension last
        text += "{" + ",".join(str(d) for d in reversed(range(len(dims)))) + "}"
    return text


def _unwritten(op: Any) -> NotImplementedError:
    return NotImplementedError(
        f"xlasim does not simulate the IR text of {op} with these operands ({_WRITTEN})"
    )


class _Printer:
    def __init__(self, float_storage: str | None, long_storage: bool | None) -> None:
        self.lines: list[str] = []
        self.ids: dict[int, tuple[int, torch.dtype]] = {}  # id(IR value) -> (number, dtype)
        self.dynamic: dict[int, bool] = {}  # id(IR value) -> whether its shape is dynamic
        self.storage = float_storage or legacy_bf16.OFF
        self.long_storage = long_storage

    def _shape(self, dtype: torch.dtype, dims: tuple[int, ...]) -> str:
        stored = legacy_bf16.stored_dtype(dtype, self.storage)
        return _shape(legacy_long.stored_dtype(stored, self.long_storage), dims)

    def _emit(self, key: int, dtype: torch.dtype, shape: str, text: str) -> int:
        number = len(self.lines)
        self.ids[key] = (number, dtype)
        self.lines.append(f"  %{number} = {shape} {text}, xla_shape={shape}")
        return number

    def _constant(self, dtype: torch.dtype) -> int:
        number = len(self.lines)
        scalar = self._shape(dtype, ())
        self.lines.append(f"  %{number} = {scalar} prim::Constant(), xla_shape={scalar}")
        return number

    def dtype(self, item: Any) -> torch.dtype:
        if not isinstance(item, Node):
            return item[1]
        if item.op is aten.nonzero.default:
            return torch.int32  # torch_xla's index type (measured on CPU)
        if item.op is aten.pow.Tensor_Scalar or item.op is aten.masked_select.default:
            return self.dtype(item.inputs[0])
        dtypes = [self.dtype(operand) for operand in item.inputs]
        result = dtypes[0]
        for other in dtypes[1:]:
            result = torch.promote_types(result, other)
        return result

    def _addc(self, item: Node, kwargs: Any) -> tuple[int, torch.dtype]:
        """``addcdiv``/``addcmul``: the ``value`` (last operand, reached first) is an f64
        number for a Python float, s64 for an int (1 when not given); a constant if 0, 1 or
        -1, else device data. Measured with tensors of one dtype only."""
        value = (kwargs or {}).get("value", 1)
        dtypes = {self.dtype(o) for o in item.inputs}
        legacy = self.storage != legacy_bf16.OFF or self.long_storage
        if type(value) not in (int, float) or len(dtypes) != 1 or legacy:
            raise _unwritten(item.op)
        scalar = _shape(torch.float64 if type(value) is float else torch.int64, ())
        kind = "prim::Constant()" if value in _CONSTANT_NUMBERS else "xla::device_data()"
        number = len(self.lines)
        self.lines.append(f"  %{number} = {scalar} {kind}, xla_shape={scalar}")
        operands = [self.value(item.inputs[i])[0] for i in reversed(range(3))]
        args = ", ".join(f"%{n}" for n in (*reversed(operands), number))
        dtype = dtypes.pop()
        shape = self._shape(dtype, tuple(item.shape or ()))
        return self._emit(id(item), dtype, shape, f"{_ADDC[item.op]}({args})"), dtype

    def _pow(self, item: Node, consts: Any) -> tuple[int, torch.dtype]:
        """``pow(tensor, number)``: the number is a constant of the tensor's type, reached
        first (the last operand)."""
        dtype = self.dtype(item)
        exponent = consts[0] if len(consts) == 1 else None
        if not dtype.is_floating_point or type(exponent) not in (int, float):
            raise _unwritten(item.op)
        constant = self._constant(dtype)
        base = self.value(item.inputs[0])[0]
        shape = self._shape(dtype, tuple(item.shape or ()))
        return self._emit(id(item), dtype, shape, f"aten::pow(%{base}, %{constant})"), dtype

    def _floor_divide(self, item: Node) -> tuple[int, torch.dtype]:
        """Floating ``floor_divide``: torch_xla's IR is a division node, then a floor node."""
        dtype = self.dtype(item)
        if not dtype.is_floating_point or {self.dtype(o) for o in item.inputs} != {dtype}:
            raise _unwritten(item.op)
        divisor = self.value(item.inputs[1])[0]
        dividend = self.value(item.inputs[0])[0]
        shape = self._shape(dtype, tuple(item.shape or ()))
        quotient = len(self.lines)
        self.lines.append(
            f"  %{quotient} = {shape} aten::div(%{dividend}, %{divisor}), xla_shape={shape}"
        )
        return self._emit(id(item), dtype, shape, f"aten::floor(%{quotient})"), dtype

    def _dynamic_shape(self, item: Any) -> bool:
        """Whether the value's shape has a dynamic dimension."""
        known = self.dynamic.get(id(item))
        if known is None:
            if not isinstance(item, Node):
                known = any(isinstance(d, Bound) for d in item[0])
            else:
                known = item.op in _DYNAMIC or any(self._dynamic_shape(o) for o in item.inputs)
            self.dynamic[id(item)] = known
        return known

    def _static_dims(self, item: Any) -> tuple[int, ...]:
        return tuple(item.shape or ()) if isinstance(item, Node) else tuple(item[0])

    def _dynamic(self, item: Node) -> tuple[int, torch.dtype]:
        """``nonzero``/``masked_select`` lowered with a dynamic first dimension
        (``XLA_EXPERIMENTAL``): a node of two outputs, the values and their count."""
        if any(self._dynamic_shape(o) for o in item.inputs):
            raise _unwritten(item.op)
        dims = [self._static_dims(o) for o in item.inputs]
        count = math.prod(torch.broadcast_shapes(*dims))
        values = (count, len(dims[0])) if item.op is aten.nonzero.default else (count,)
        dtype = self.dtype(item)
        numbers = [self.value(o)[0] for o in reversed(item.inputs)][::-1]
        shape = self._shape(dtype, tuple(Bound(d) if i == 0 else d for i, d in enumerate(values)))
        shapes = f"({shape}, {self._shape(torch.int32, ())})"
        number = len(self.lines)
        self.ids[id(item)] = (number, dtype)
        operands = ", ".join(f"%{n}" for n in numbers)
        self.lines.append(
            f"  %{number} = {shapes} {item.op._schema.name}({operands}), num_outputs=2, "
            f"xla_shape={shapes}"
        )
        return number, dtype

    def value(self, item: Any) -> tuple[int, torch.dtype]:
        known = self.ids.get(id(item))
        if known is not None:
            return known
        if isinstance(item, Node) and item.op in _DYNAMIC:
            return self._dynamic(item)
        if isinstance(item, Node) and any(self._dynamic_shape(o) for o in item.inputs):
            raise _unwritten(item.op)  # an op on a dynamic value: its shape is not written
        if not isinstance(item, Node):  # a device-data key: (shape, dtype, sharding)
            shape = self._shape(item[1], tuple(item[0]))
            self._emit(id(item), item[1], shape, "xla::device_data()")
            return self.ids[id(item)]
        consts, kwargs = item.args if isinstance(item.args, tuple) else ((), {})
        if item.op is aten.pow.Tensor_Scalar and len(item.inputs) == 1 and not kwargs:
            return self._pow(item, consts)
        if item.op is aten.floor_divide.default and len(item.inputs) == 2 and not consts:
            return self._floor_divide(item)
        if item.op in _ADDC and len(item.inputs) == 3 and not list(consts):
            return self._addc(item, kwargs)
        name = _WITH_ALPHA.get(item.op) or _PLAIN.get(item.op)
        alpha = (kwargs or {}).get("alpha", 1)
        if name is None or len(item.inputs) != 2 or list(consts) or alpha != 1:
            raise _unwritten(item.op)
        dtype = self.dtype(item)
        numbers: dict[int, int] = {}
        if item.op in _WITH_ALPHA:  # the last operand: reached first
            numbers[2] = self._constant(dtype)
        for index in reversed(range(2)):
            numbers[index] = self.value(item.inputs[index])[0]
        args = ", ".join(f"%{numbers[i]}" for i in sorted(numbers))
        shape = self._shape(dtype, tuple(item.shape or ()))
        return self._emit(id(item), dtype, shape, f"{name}({args})"), dtype


def tensors_text(
    tensors: list[XlaSimTensor],
    float_storage: str | None = None,
    long_storage: bool | None = None,
) -> str:
    """The text; ``float_storage`` and ``long_storage`` are the runtime's legacy bfloat16
    and 32-bit long modes (None: off)."""
    printer = _Printer(float_storage, long_storage)
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
