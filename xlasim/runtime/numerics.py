"""What a TPU's matrix unit computes for matmul-class ops, on CPU tensors.

A TPU multiplies bfloat16 values exactly and accumulates in float32. A float32 matmul or
convolution runs at torch_xla's mat-mul precision (``torch_xla.backends.set_mat_mul_precision``):

- ``default``: each operand rounded to bfloat16 (round to nearest even), one pass;
- ``high``: each operand split into two bfloat16 parts ``x = x0 + x1``; the three products
  ``x0*y0 + x0*y1 + x1*y0``;
- ``highest``: a three-way split ``x = x0 + x1 + x2``; the six products with ``i + j <= 2``.

``high`` cuts its leading part (``x0`` keeps ``x``'s upper 16 bits) and rounds the other to
nearest even, as XLA splits operands for its ``BF16_BF16_F32_X3`` dot algorithm; the cut leaves
up to a whole bfloat16 ulp to ``x1``, so ``high`` errs by up to about 2^-14 of a product, which
pytorch/xla's TPU test of the precisions (``test/test_mat_mul_precision.py``) requires of a TPU.
``highest`` rounds all three parts: cutting them too (XLA's ``_X6`` rewrite for other backends)
errs past the 22-bit bound that the same test holds a TPU to.

The CPU kernel is the multiplier here. The passes are grouped so that fewer CPU matmuls make
the same sums: ``x0*y0 + x0*y1 = x0*(y0 + y1)``, where ``y0 + y1`` is exact in float32 (both
parts lie on the grid of ``y``'s own 24 bits), so ``high`` is two CPU matmuls
(``x0*(y0 + y1) + x1*y0``) and ``highest`` three (``x0*(y0 + y1 + y2) + x1*(y0 + y1) + x2*y0``).
A grouped product carries more than 24 bits and is rounded once more, by at most half a float32
ulp: the same size as the float32 accumulation's own roundings, whose order XLA does not fix
either. The splitting is one pass of the device extension (``xlasim::bf16_parts``). Where an
operand is infinite its smaller parts are zero and a grouped ``0 * inf`` would be nan; there, as
in XLA, the smaller parts' products are summed first, a nan among them gives way to zero, and
the leading product ``x0*y0`` is added last.

bfloat16 operands are multiplied exactly and summed in float32, then rounded once to bfloat16.
Other dtypes (float64, float16, integers) compute as the CPU kernel does. The PJRT CPU client
(``PJRT_DEVICE=CPU``) is exact, as real XLA:CPU ignores the precision; so is a TPU simulation
run with ``XLASIM_NUMERICS=exact`` -- which is *not* what a TPU computes.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import torch

from xlasim.runtime import graph as _graph
from xlasim.runtime import state as _runtime
from xlasim.runtime.settings import PRECISIONS

__all__ = [
    "MATMUL_CLASS",
    "PRECISIONS",
    "emulated",
    "level",
    "parts",
    "set_precision",
]

aten = torch.ops.aten

_F32 = torch.float32
_BF16 = torch.bfloat16


def set_precision(runtime: Any, precision: str) -> None:
    """Sets the runtime's level. The simulator computes an op at the level in force when the
    op is traced; torch_xla reads it when it lowers a graph, and a graph compiled before keeps
    its level (the precision is not in the graph hash). A change after matmuls were traced
    is where the two can differ, so it says so."""
    emulated = runtime.numerics != "exact" and runtime.client_initialized and runtime.client.is_tpu
    if precision != runtime.mat_mul_precision and emulated and runtime.graphs.traced_any:
        warnings.warn(
            f"xlasim: the mat-mul precision changed from {runtime.mat_mul_precision!r} to "
            f"{precision!r} after this process traced device ops; the simulator computes each "
            "op at the level in force when it is traced, torch_xla at the level in force when "
            "its graph is first compiled (a cached graph keeps its level). Set the precision "
            "once, before the first device op, for results that agree.",
            stacklevel=3,
        )
    runtime.mat_mul_precision = precision


def level() -> str | None:
    """The precision the active simulation's f32 matmuls run at, or None for exact ones."""
    runtime = _runtime.active()
    if runtime is None or runtime.numerics == "exact" or runtime.dry_run:
        return None
    client = runtime.client
    return runtime.mat_mul_precision if client.is_tpu else None


def parts(x: torch.Tensor, n: int, cumulative: bool = False) -> list[torch.Tensor]:
    """``x`` (float32) as ``n`` bfloat16 values (held in float32) whose sum is ``x``, largest
    first, each the bfloat16 rounding of what the ones before it left (a two-way split cuts its
    first part instead); or, ``cumulative``, their
    running sums ``x0, x0 + x1, ...`` (exact in float32). One pass of the device extension."""
    global _split
    if _split is None:  # the device extension is loaded once a simulation starts
        _split = torch.ops.xlasim.bf16_parts.default._op
    return _split(x, n, cumulative)


_split: Callable[..., list[torch.Tensor]] | None = None


def _dot_at(a: torch.Tensor, b: torch.Tensor, precision: str) -> torch.Tensor:
    """mm, bmm, mv or dot of float32 ``a`` and ``b`` at ``precision``: the grouped products of
    :func:`_pairs`, summed, in one call of the device extension (``xlasim::bf16_product``),
    because on a small matmul the calls themselves cost as much as the product."""
    global _fused
    if _fused is None:
        _fused = torch.ops.xlasim.bf16_product.default._op
    return _fused(a, b, _PASSES[precision])


_fused: Callable[..., torch.Tensor] | None = None


def _pairs(a: torch.Tensor, b: torch.Tensor, precision: str) -> list[tuple[Any, Any]]:
    """The (left, right) operands of the CPU products whose sum is the TPU's result:
    ``sum(a_i * b_j for i + j < n)`` as ``sum(a_i * (b_0 + ... + b_(n-1-i)))``."""
    n = _PASSES[precision]
    left = parts(a, n)
    right = parts(b, n, cumulative=True)
    return [(left[i], right[n - 1 - i]) for i in range(n)]


_PASSES = {"default": 1, "high": 2, "highest": 3}


def _summed(product: Callable[[Any, Any], Any], a: Any, b: Any, precision: str) -> Any:
    """``product(a, b)`` -- bilinear in ``a`` and ``b`` -- as the TPU computes it."""
    terms = [product(x, y) for x, y in _pairs(a, b, precision)]
    out = terms[0]
    for t in terms[1:]:
        out = out + t
    if len(terms) > 1 and math.isnan(out.sum().item()):  # one reduction, as in the extension
        out = _term_by_term(product, a, b, precision)
    return out


def _term_by_term(product: Callable[[Any, Any], Any], a: Any, b: Any, precision: str) -> Any:
    """The kept products one by one, the smaller parts' first (a nan among them, from an
    infinite operand's zero parts, gives way to zero), then ``x0*y0``: XLA's order, which the
    grouped sum cannot keep where an operand is infinite."""
    n = _PASSES[precision]
    xs, ys = parts(a, n), parts(b, n)
    small = sum(product(xs[i], ys[j]) for i in range(n) for j in range(n - i) if i + j)
    return torch.nan_to_num(small, nan=0.0, posinf=float("inf"), neginf=float("-inf")) + product(
        xs[0], ys[0]
    )


def _dtype(a: Any, b: Any) -> torch.dtype | None:
    """The dtype both operands share when it is one the TPU's precision rules cover."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return None
    if a.dtype is not b.dtype or a.dtype not in (_F32, _BF16):
        return None
    return a.dtype


def _mixed_dtypes(a: Any, b: Any) -> bool:
    return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype != b.dtype


def _product(
    product: Callable[[Any, Any], Any],
    a: Any,
    b: Any,
    precision: str | None,
    dot: bool = False,
) -> Any | None:
    """``product(a, b)`` as the TPU computes it, or None where the CPU kernel's result stands.
    ``dot``: ``product`` is mm, bmm, mv or dot, which the device extension computes whole."""
    dtype = _dtype(a, b)
    if dtype is None or precision is None:
        return None
    if dtype is _BF16:  # exact products, float32 sums, one rounding
        return product(a.to(_F32), b.to(_F32)).to(_BF16)
    if dot:
        return _dot_at(a, b, precision)
    return _summed(product, a, b, precision)


def bilinear(product: Callable[[Any, Any], Any], a: Any, b: Any) -> Any:
    """``product(a, b)`` -- bilinear in ``a`` and ``b``, e.g. an einsum -- as the active
    simulation's TPU computes it: for kernels that multiply on the CPU values themselves (a
    custom op's), which the dispatcher's table above never sees."""
    out = _product(product, a, b, level())
    return product(a, b) if out is None else out


def _with_bias(product: Any, bias: Any, beta: Any, alpha: Any) -> Any:
    # torch_xla lowers addmm-like ops as ``alpha * dot + beta * bias`` (the plain sum when both
    # are 1): the bias is added in the output dtype after the product.
    if beta == 1 and alpha == 1:
        return product + bias
    return product * alpha + bias * beta


def _plain(op: Any) -> Callable[..., Any]:
    return getattr(op, "_op", op)


def _matmul(op: Any, level_of: Callable[[], str | None]) -> Callable[..., Any]:
    """mm, bmm, mv, dot: ``op(a, b)``."""
    call = _plain(op)

    def run(a: Any, b: Any, *rest: Any, **kwargs: Any) -> Any:
        mixed = _mixed_dtypes(a, b) and not rest and not kwargs
        if mixed:
            # torch_xla lowers a product of two dtypes to one dot of both (bf16 by s8 for a
            # quantized weight): computed in their promoted dtype, the result in the first
            # operand's (measured on torch_xla 2.9: s8 @ f32 gives s8, f32 @ s8 gives f32).
            out_dtype = a.dtype
            common = torch.promote_types(a.dtype, b.dtype)
            a, b = a.to(common), b.to(common)
        out = None
        if not rest and not kwargs:
            out = _product(call, a, b, level_of(), dot=True)
        if out is None:
            out = call(a, b, *rest, **kwargs)
        return out.to(out_dtype) if mixed else out

    return run


def _biased(
    op: Any, level_of: Callable[[], str | None], product_op: Any, reduce_batch: bool = False
) -> Callable[..., Any]:
    """addmm, baddbmm, addmv, addbmm: ``op(bias, a, b, *, beta, alpha)``."""
    call = _plain(op)
    product_call = _plain(product_op)

    def run(bias: Any, a: Any, b: Any, *rest: Any, beta: Any = 1, alpha: Any = 1) -> Any:
        product = None if rest else _product(product_call, a, b, level_of(), dot=True)
        if product is None:
            return call(bias, a, b, *rest, beta=beta, alpha=alpha)
        if reduce_batch:
            product = product.sum(0)
        return _with_bias(product, bias, beta, alpha)

    return run


def _convolution(op: Any, level_of: Callable[[], str | None]) -> Callable[..., Any]:
    """convolution(input, weight, bias, stride, padding, dilation, transposed, out_pad, groups)."""
    call = _plain(op)

    def run(x: Any, w: Any, bias: Any, *conv: Any) -> Any:
        out = _product(lambda p, q: call(p, q, None, *conv), x, w, level_of())
        if out is None:
            return call(x, w, bias, *conv)
        if bias is not None:
            out = out + bias.reshape((1, -1) + (1,) * (out.dim() - 2))
        return out

    return run


def _convolution_backward(op: Any, level_of: Callable[[], str | None]) -> Callable[..., Any]:
    """convolution_backward(grad_out, input, weight, bias_sizes, *conv, output_mask).

    The input's gradient is bilinear in (grad_out, weight), the weight's in (input, grad_out);
    the bias's is a sum of grad_out (no matmul) and comes from the CPU kernel as it is."""
    call = _plain(op)

    def run(grad: Any, x: Any, w: Any, bias_sizes: Any, *rest: Any) -> Any:
        precision = level_of()
        *conv, mask = rest
        if precision is None or _dtype(grad, x) is None or _dtype(grad, w) is None:
            return call(grad, x, w, bias_sizes, *conv, mask)
        grad_input = grad_weight = grad_bias = None
        if mask[0]:
            grad_input = _product(
                lambda g, q: call(g, x, q, bias_sizes, *conv, [True, False, False])[0],
                grad,
                w,
                precision,
            )
        if mask[1]:
            grad_weight = _product(
                lambda p, g: call(g, p, w, bias_sizes, *conv, [False, True, False])[1],
                x,
                grad,
                precision,
            )
        if mask[2]:
            grad_bias = call(grad, x, w, bias_sizes, *conv, [False, False, True])[2]
        return grad_input, grad_weight, grad_bias

    return run


_Maker = Callable[[Any, Callable[[], "str | None"]], Callable[..., Any]]


def _table() -> dict[Any, _Maker]:
    return {
        aten.mm.default: _matmul,
        aten.bmm.default: _matmul,
        aten.mv.default: _matmul,
        aten.dot.default: _matmul,
        aten.addmm.default: lambda op, lv: _biased(op, lv, aten.mm.default),
        aten.baddbmm.default: lambda op, lv: _biased(op, lv, aten.bmm.default),
        aten.addmv.default: lambda op, lv: _biased(op, lv, aten.mv.default),
        aten.addbmm.default: lambda op, lv: _biased(op, lv, aten.bmm.default, reduce_batch=True),
        aten.convolution.default: _convolution,
        aten.convolution_backward.default: _convolution_backward,
    }


_EMULATED: dict[Any, _Maker] = _table()

MATMUL_CLASS: tuple[Any, ...] = tuple(_EMULATED)
"""The ops whose float32 and bfloat16 forms the TPU's matrix unit computes."""

_graph.watch_precision(level, MATMUL_CLASS)


def emulated(op: Any, level_of: Callable[[], str | None] = level) -> Callable[..., Any] | None:
    """The callable that computes ``op`` as the TPU does (choosing per call by the precision
    ``level_of()`` gives -- the active torch_xla simulation's by default -- and the operand
    dtypes), or None when ``op`` is not matmul-class."""
    make = _EMULATED.get(op)
    return make(op, level_of) if make is not None else None
