"""Shape errors in XLA's words.

torch_xla raises shape errors while tracing, with XLA shapes (``f32[2,3]``); eager CPU kernels
word the same mistakes differently. For the ops below the simulator re-raises the CPU error with
the message real torch_xla 2.9 gives (each checked on PJRT CPU); others keep torch's message.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from xlasim.runtime import dynamic_dims
from xlasim.sharding.messages import torch_xla_error

aten = torch.ops.aten

_XLA_TYPES = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int64: "s64",
    torch.int32: "s32",
    torch.int16: "s16",
    torch.int8: "s8",
    torch.uint8: "u8",
    torch.uint16: "u16",
    torch.uint32: "u32",
    torch.uint64: "u64",
    torch.bool: "pred",
    torch.complex64: "c64",
    torch.complex128: "c128",
    torch.float8_e5m2: "f8e5m2",
    torch.float8_e4m3fn: "f8e4m3fn",
    torch.float8_e5m2fnuz: "f8e5m2fnuz",
    torch.float8_e4m3fnuz: "f8e4m3fnuz",
}

_BROADCAST = re.compile(
    r"The size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\) at "
    r"non-singleton dimension (\d+)"
)


def xla_type(dtype: torch.dtype) -> str:
    """XLA's name of ``dtype`` (``f32``, ``bf16``...)."""
    return _XLA_TYPES.get(dtype, str(dtype))


def xla_shape(t: torch.Tensor) -> str:
    return f"{_XLA_TYPES.get(t.dtype, str(t.dtype))}[{','.join(map(str, t.shape))}]"


def _broadcast(tensors: list[torch.Tensor], message: str) -> str | None:
    m = _BROADCAST.search(message)
    if m is None or len(tensors) < 2:
        return None
    a, b = tensors[0], tensors[1]
    out_rank = max(a.dim(), b.dim())
    # XLA checks the static shapes (a dynamic dimension at its bound) and names the outermost
    # clash, where torch names the innermost (measured on torch_xla 2.9: f32[2,2,4,4] vs.
    # f32[2,2] names dimension 2 of the first).
    sizes_a, sizes_b = dynamic_dims.bounds(a.shape), dynamic_dims.bounds(b.shape)
    clashes = [
        d
        for d in range(out_rank)
        if (da := d - (out_rank - a.dim())) >= 0
        and (db := d - (out_rank - b.dim())) >= 0
        and sizes_a[da] != sizes_b[db]
        and 1 not in (sizes_a[da], sizes_b[db])
    ]
    dim = clashes[0] if clashes else int(m.group(3))
    da, db = dim - (out_rank - a.dim()), dim - (out_rank - b.dim())
    # torch_xla brings both operands to their common type first (measured on torch_xla 2.9:
    # an s32 and an s64 operand are both written s64).
    common = xla_type(torch.promote_types(a.dtype, b.dtype))
    sa, sb = (f"{common}[{','.join(map(str, t.shape))}]" for t in (a, b))
    return (
        f"Shapes are not compatible for broadcasting: {sa} vs. {sb}. Expected dimension {da} "
        f"of shape {sa} ({sizes_a[da]}) to match dimension {db} of shape {sb} ({sizes_b[db]}). "
        "Either that or that any of them is either 1 or unbounded. Try reshaping one of the "
        "tensors to match the other."
    )


def _mm(tensors: list[torch.Tensor], message: str) -> str | None:
    a, b = tensors[0], tensors[1]
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] == b.shape[0]:
        return None
    return (
        f"mm(): cannot matrix-multiply tensors {xla_shape(a)} and {xla_shape(b)}. Expected the "
        f"size of dimension 1 of the first input tensor ({a.shape[1]}) to be equal the size of "
        f"dimension 0 of the second input tensor ({b.shape[0]})."
    )


def _mv(tensors: list[torch.Tensor], message: str) -> str | None:
    a, b = tensors[0], tensors[1]
    return (
        f"Cannot infer shape for dot operation: {xla_shape(a)} <dot> {xla_shape(b)}. "
        "Contracting dimension sizes are not compatible."
    )


def _bmm(tensors: list[torch.Tensor], message: str) -> str | None:
    a, b = tensors[0], tensors[1]
    if a.dim() != 3 or b.dim() != 3:
        return None
    for dim, expected in ((0, a.shape[0]), (1, a.shape[2])):
        if b.shape[dim] != expected:
            return (
                f"Check failed: t->size(dim) == expected_size ({b.shape[dim]} vs. {expected})"
                f"Expected tensor to have size {expected} at dimension {dim}, but got size "
                f"{b.shape[dim]} for argument #2 'batch2' (while checking arguments for bmm)"
            )
    return None


def _cat(tensors: list[torch.Tensor], message: str, dim: int = 0) -> str | None:
    first = tensors[0]
    dim = dim % max(first.dim(), 1)
    for other in tensors[1:]:
        if other.dim() != first.dim() or any(
            x != y
            for i, (x, y) in enumerate(zip(first.shape, other.shape, strict=True))
            if i != dim
        ):
            return (
                f"cat(): cannot concatenate tensors of shape {xla_shape(first)} with "
                f"{xla_shape(other)} at dimension {dim}. Expected shapes to be equal (except "
                f"at dimension {dim}) or that either of them was a 1D empty tensor of size (0,)."
            )
    return None


_BY_OP = {
    aten.mm.default: _mm,
    aten.mv.default: _mv,
    aten.bmm.default: _bmm,
}


def translate(func: Any, args: tuple[Any, ...], error: RuntimeError) -> str | None:
    """XLA's message for ``error`` raised by ``func`` on ``args`` (CPU tensors), or None."""
    message = str(error)
    if func is aten.cat.default:
        dim = args[1] if len(args) > 1 else 0
        return _cat(list(args[0]), message, dim)
    if func in _FULL_REDUCTIONS and "Expected reduction dim to be specified" in message:
        return _EMPTY_FULL_REDUCTION
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    handler = _BY_OP.get(func)
    if handler is not None and len(tensors) >= 2:
        return handler(tensors, message)
    return _broadcast(tensors, message)


# max()/min() of an empty tensor: torch_xla's shape check fails before torch's own message.
_FULL_REDUCTIONS = frozenset({aten.max.default, aten.min.default})
_EMPTY_FULL_REDUCTION = "Check failed: 0 < xla::ShapeUtil::ElementsIn(GetXlaShape(input)) (0 vs. 0)"
_DIM_REDUCTIONS = frozenset({aten.max.dim, aten.min.dim})
_DIM_OPS = frozenset({aten.flip.default, aten.sum.dim_IntList})
_DIM_OUT_OF_RANGE = re.compile(r"^Dimension out of range (\(expected to be in range .*)$")


def translate_index_error(func: Any, error: IndexError) -> str | None:
    """The RuntimeError message torch_xla 2.9 gives where CPU torch raises IndexError ``error``
    (each measured on PJRT CPU), or None where torch_xla raises the IndexError too."""
    message = str(error)
    if func in _DIM_REDUCTIONS and "Expected reduction dim" in message:
        return "Check failed: 0 < *rinfo.element_count.scalar_size (0 vs. 0)"
    m = _DIM_OUT_OF_RANGE.match(message)
    if func in _DIM_OPS and m:
        return f"Value out of range {m.group(1)}"
    return None


# -- messages torch_xla words with at::Tensor::toString() ----------------------------------------
# torch's legacy tensor type names ('torch.FloatTensor') where the dtype has one; otherwise
# '<backend><ScalarType>Type' (checked on torch_xla 2.9: bfloat16 is 'CPUBFloat16Type').
_LEGACY_TYPE_NAMES = {
    torch.float32: "torch.FloatTensor",
    torch.float64: "torch.DoubleTensor",
    torch.float16: "torch.HalfTensor",
    torch.int64: "torch.LongTensor",
    torch.int32: "torch.IntTensor",
    torch.int16: "torch.ShortTensor",
    torch.int8: "torch.CharTensor",
    torch.uint8: "torch.ByteTensor",
}
_SCALAR_TYPE_NAMES = {
    torch.bfloat16: "BFloat16",
    torch.bool: "Bool",
    torch.complex64: "ComplexFloat",
    torch.complex128: "ComplexDouble",
    torch.complex32: "ComplexHalf",
}


def aten_type_string(t: torch.Tensor) -> str:
    """``at::Tensor::toString()`` of a CPU tensor, as torch_xla's errors print it."""
    legacy = _LEGACY_TYPE_NAMES.get(t.dtype)
    if legacy is not None:
        return legacy
    name = _SCALAR_TYPE_NAMES.get(t.dtype, str(t.dtype).replace("torch.", "").capitalize())
    return f"CPU{name}Type"


def expected_xla_tensor(t: torch.Tensor, hint: str) -> RuntimeError:
    """``bridge::GetXlaTensor``'s error for a CPU tensor, with ``hint`` as its note."""
    return torch_xla_error(RuntimeError, f"Expected XLA tensor. Got: {aten_type_string(t)}", hint)
