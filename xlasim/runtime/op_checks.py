"""Argument checks torch_xla 2.9 makes itself before tracing an op, with its messages.

Where torch_xla validates an op's arguments in its own kernel (rather than leaving it to the
computation), it raises a RuntimeError in its words; eager CPU kernels word the same mistakes
differently (``random_ expects 'from' to be less than 'to'...``). The simulator runs these
checks before computing, in torch_xla's order, for: ``div`` with a rounding mode, ``flip``,
``full``, ``gather``, ``mm``, ``random_``, ``roll`` and ``trace``. Messages are torch_xla 2.9's
(its ``tensor_methods`` and ``aten_xla_type`` checks; pytorch/xla's test_ops_error_message.py
pins them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from xlasim.runtime.errors import xla_shape

aten = torch.ops.aten


def _join(values: Sequence[Any]) -> str:
    return ", ".join(str(int(v)) for v in values)


def _div(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    mode = kwargs.get("rounding_mode", args[2] if len(args) > 2 else None)
    if mode is None or mode in ("trunc", "floor"):
        return None
    return (
        f"div(): invalid rounding mode `{mode}`. Expected it to be either 'trunc', 'floor', or "
        "be left unspecified."
    )


def _div_inplace(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    mode = kwargs.get("rounding_mode", args[2] if len(args) > 2 else None)
    if mode is None or mode in ("trunc", "floor"):
        return None
    # In place, torch_xla 2.9 reaches torch's Python reference of div, which raises ValueError.
    raise ValueError(
        f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but found {mode}."
    )


def _flip(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    self, dims = args[0], list(kwargs.get("dims", args[1] if len(args) > 1 else []))
    rank = self.dim()
    if rank == 0 or any(not -rank <= d < rank for d in dims):
        return None  # torch's own range error stands
    count = [0] * rank
    for d in dims:
        count[d % rank] += 1
    if max(count, default=0) <= 1:
        return None
    repeated = ", ".join(f"{d} ({n} times)" for d, n in enumerate(count) if n > 1)
    kept = _join([d for d, n in enumerate(count) if n])
    return (
        f"flip(): expected each dimension to appear at most once. Found dimensions: {repeated}. "
        f"Consider changing dims from [{_join(dims)}] to [{kept}]."
    )


def _full(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    sizes = list(args[0])
    if not any(int(s) < 0 for s in sizes):
        return None
    return (
        "full(): expected concrete sizes (i.e. non-symbolic) to be positive values. However "
        f"found negative ones: [{_join(sizes)}]."
    )


def _gather(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    self, dim, index = args[0], args[1], args[2]
    rank, index_rank = self.dim(), index.dim()
    if rank != index_rank:
        return (
            f"gather(): expected rank of input ({rank}) and index ({index_rank}) tensors to be "
            "the same."
        )
    if rank == 0 or not -rank <= dim < rank:
        return None
    dim %= rank
    bad = [d for d in range(rank) if d != dim and self.shape[d] < index.shape[d]]
    if not bad:
        return None
    return (
        f"gather(): expected sizes of index [{_join(index.shape)}] to be smaller or equal those "
        f"of input [{_join(self.shape)}] on all dimensions, except on dimension {dim}. However, "
        f"that's not true on dimensions [{_join(bad)}]."
    )


def _matrix(t: torch.Tensor, op: str, which: str = "") -> str | None:
    if t.dim() == 2:
        return None
    arg = f"{which} " if which else ""
    return (
        f"{op}(): expected the {arg}input tensor {xla_shape(t)} to be a matrix (i.e. a 2D tensor)."
    )


def _mm(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    return _matrix(args[0], "mm", "first") or _matrix(args[1], "mm", "second")


def _trace(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    return _matrix(args[0], "trace")


# Types whose range is wider than int64's: torch_xla checks those values against int64's.
_WIDER_THAN_LONG = (torch.bfloat16, torch.float32, torch.float64)


def _range(dtype: torch.dtype) -> tuple[int, int]:
    if dtype in _WIDER_THAN_LONG:
        dtype = torch.int64
    if dtype == torch.bool:
        return 0, 1
    if dtype.is_floating_point:
        info = torch.finfo(dtype)
        return int(info.min), int(info.max)
    iinfo = torch.iinfo(dtype)
    return iinfo.min, iinfo.max


def _out_of_range(dtype: torch.dtype, arg: str, value: int) -> str | None:
    low, high = _range(dtype)
    if low <= value <= high:
        return None
    side, bound = ("lower", "lower bound") if value < low else ("greater", "upper bound")
    return (
        f"random_(): expected `{arg}` to be within the range [{low}, {high}]. However got value "
        f"{value}, which is {side} than the {bound}."
    )


# The bits of each floating type's significand, implicit bit included: random_ without `to`
# draws below 2**digits, where every integer is representable.
_DIGITS = {torch.float16: 11, torch.bfloat16: 8, torch.float32: 24, torch.float64: 53}


def _upper_limit(dtype: torch.dtype) -> int:
    if dtype in _DIGITS:
        return 1 << _DIGITS[dtype]
    return _range(dtype)[1]


def _random_from(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    self, low = args[0], int(args[1])
    high = args[2] if len(args) > 2 else kwargs.get("to")
    if high is None:  # one past the type's own limit (long: the limit, which must not overflow)
        high = _upper_limit(self.dtype) + (0 if self.dtype == torch.int64 else 1)
    high = int(high)
    message = _out_of_range(self.dtype, "from", low) or _out_of_range(self.dtype, "to", high - 1)
    if message is None and low >= high:
        message = f"random_(): expected `from` ({low}) to be smaller than `to` ({high})."
    return message


def _random_to(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    return _out_of_range(args[0].dtype, "to", int(args[1]) - 1)


def _roll(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    shifts = list(kwargs.get("shifts", args[1]))
    dims = list(kwargs.get("dims", args[2] if len(args) > 2 else []))
    if not shifts:
        return "roll(): expected `shifts` to have at least 1 element."
    if not dims and len(shifts) != 1:
        return (
            f"roll(): expected `shifts` [{_join(shifts)}] (size={len(shifts)}) to have exactly "
            "1 element when `dims` is empty."
        )
    if dims and len(dims) != len(shifts):
        return (
            f"roll(): expected `dims` [{_join(dims)}] (size={len(dims)}) to match the size of "
            f"`shifts` [{_join(shifts)}] (size={len(shifts)})."
        )
    return None


_Check = Callable[[tuple[Any, ...], dict[str, Any]], "str | None"]
_CHECKS: dict[Any, _Check] = {
    aten.div.Tensor_mode: _div,
    aten.div_.Tensor_mode: _div_inplace,
    aten.div.Scalar_mode: _div,
    aten.div_.Scalar_mode: _div_inplace,
    aten.flip.default: _flip,
    aten.full.default: _full,
    aten.gather.default: _gather,
    aten.mm.default: _mm,
    getattr(aten.random_, "from"): _random_from,  # 'from' is a Python keyword
    aten.random_.to: _random_to,
    aten.roll.default: _roll,
    aten.trace.default: _trace,
}


def check(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Raises torch_xla's RuntimeError when ``func``'s arguments fail one of its checks."""
    checker = _CHECKS.get(func)
    if checker is not None:
        message = checker(args, kwargs)
        if message is not None:
            raise RuntimeError(message)
