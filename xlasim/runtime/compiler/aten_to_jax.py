"""ATen ops as ``jax.numpy``/``lax`` functions: what the TPU compiler needs to see a graph.

The graphs handed to the TPU compiler are functional core-ATen graphs (``torch._decomp``'s core
decompositions have already turned backward ops, losses and optimizer arithmetic into these),
so this table covers the core ops training steps use rather than all of ATen.  An op that is
missing raises ``NotImplementedError`` naming it; nothing is guessed.

Part of the optional TPU-compiler layer: importing it imports jax.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

aten = torch.ops.aten

_DTYPES: dict[torch.dtype, Any] = {
    torch.float32: jnp.float32,
    torch.float64: jnp.float64,
    torch.float16: jnp.float16,
    torch.bfloat16: jnp.bfloat16,
    torch.int64: jnp.int64,
    torch.int32: jnp.int32,
    torch.int16: jnp.int16,
    torch.int8: jnp.int8,
    torch.uint8: jnp.uint8,
    torch.bool: jnp.bool_,
    torch.complex64: jnp.complex64,
}


def jax_dtype(dtype: torch.dtype) -> Any:
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise NotImplementedError(f"dtype {dtype} has no TPU compiler equivalent here") from None


LOWERINGS: dict[Any, Callable[..., Any]] = {}


def lowers(*ops: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        for op in ops:
            LOWERINGS[op] = fn
        return fn

    return register


def lower(op: Any) -> Callable[..., Any]:
    fn = LOWERINGS.get(op)
    if fn is None:
        raise NotImplementedError(f"the TPU compiler layer has no lowering for the aten op {op}")
    return fn


def _dims(dim: Any, rank: int) -> tuple[int, ...]:
    if dim is None:
        return tuple(range(rank))
    if isinstance(dim, int):
        dim = (dim,)
    return tuple(d % rank if rank else 0 for d in dim) or tuple(range(rank))


def _as_dtype(x: Any, dtype: torch.dtype | None) -> Any:
    return x if dtype is None else x.astype(jax_dtype(dtype))


def _promote(*xs: Any) -> list[Any]:
    """torch's result type for tensors and Python scalars (scalars do not widen tensors)."""
    arrays = [x for x in xs if isinstance(x, jax.Array) or hasattr(x, "aval")]
    if not arrays:
        return [jnp.asarray(x) for x in xs]
    dtype = jnp.result_type(*arrays)
    if any(isinstance(x, float) for x in xs) and not jnp.issubdtype(dtype, jnp.inexact):
        dtype = jnp.float32
    return [jnp.asarray(x, dtype=dtype) for x in xs]


# -- elementwise -----------------------------------------------------------------------------
def _binary(fn: Callable[[Any, Any], Any]) -> Callable[..., Any]:
    def run(x: Any, y: Any, *, alpha: Any = 1) -> Any:
        x, y = _promote(x, y)
        return fn(x, y if alpha == 1 else y * alpha)

    return run


lowers(aten.add.Tensor, aten.add.Scalar)(_binary(jnp.add))
lowers(aten.sub.Tensor, aten.sub.Scalar)(_binary(jnp.subtract))
lowers(aten.rsub.Scalar, aten.rsub.Tensor)(_binary(lambda x, y: y - x))
lowers(aten.mul.Tensor, aten.mul.Scalar)(_binary(jnp.multiply))
lowers(aten.maximum.default)(_binary(jnp.maximum))
lowers(aten.minimum.default)(_binary(jnp.minimum))
lowers(aten.pow.Tensor_Tensor)(_binary(jnp.power))
lowers(aten.atan2.default)(_binary(jnp.arctan2))
lowers(aten.eq.Tensor, aten.eq.Scalar)(lambda x, y: jnp.equal(x, y))
lowers(aten.ne.Tensor, aten.ne.Scalar)(lambda x, y: jnp.not_equal(x, y))
lowers(aten.lt.Tensor, aten.lt.Scalar)(lambda x, y: jnp.less(x, y))
lowers(aten.le.Tensor, aten.le.Scalar)(lambda x, y: jnp.less_equal(x, y))
lowers(aten.gt.Tensor, aten.gt.Scalar)(lambda x, y: jnp.greater(x, y))
lowers(aten.ge.Tensor, aten.ge.Scalar)(lambda x, y: jnp.greater_equal(x, y))
lowers(aten.logical_and.default)(jnp.logical_and)
lowers(aten.logical_or.default)(jnp.logical_or)
lowers(aten.logical_not.default)(jnp.logical_not)
lowers(aten.bitwise_and.Tensor)(jnp.bitwise_and)
lowers(aten.bitwise_not.default)(jnp.invert)


@lowers(aten.div.Tensor, aten.div.Scalar)
def _div(x: Any, y: Any) -> Any:
    x, y = _promote(x, y)
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        x, y = x.astype(jnp.float32), y.astype(jnp.float32)
    return x / y


@lowers(aten.div.Tensor_mode)
def _div_mode(x: Any, y: Any, *, rounding_mode: str | None = None) -> Any:
    q = _div(x, y)
    if rounding_mode == "trunc":
        q = jnp.trunc(q)
    elif rounding_mode == "floor":
        q = jnp.floor(q)
    return q.astype(jnp.result_type(x, y)) if rounding_mode else q


@lowers(aten.pow.Tensor_Scalar)
def _pow(x: Any, exponent: Any) -> Any:
    if exponent == 2:
        return x * x
    return jnp.power(x, jnp.asarray(exponent, dtype=x.dtype))


@lowers(aten.pow.Scalar)
def _pow_scalar(base: Any, x: Any) -> Any:
    return jnp.power(jnp.asarray(base, dtype=x.dtype), x)


_UNARY = {
    aten.neg.default: jnp.negative,
    aten.abs.default: jnp.abs,
    aten.exp.default: jnp.exp,
    aten.expm1.default: jnp.expm1,
    aten.log.default: jnp.log,
    aten.log1p.default: jnp.log1p,
    aten.log2.default: jnp.log2,
    aten.sqrt.default: jnp.sqrt,
    aten.rsqrt.default: lax.rsqrt,
    aten.reciprocal.default: jnp.reciprocal,
    aten.sin.default: jnp.sin,
    aten.cos.default: jnp.cos,
    aten.tanh.default: jnp.tanh,
    aten.sigmoid.default: jax.nn.sigmoid,
    aten.erf.default: jax.scipy.special.erf,
    aten.relu.default: jax.nn.relu,
    aten.floor.default: jnp.floor,
    aten.ceil.default: jnp.ceil,
    aten.round.default: jnp.round,
    aten.trunc.default: jnp.trunc,
    aten.sign.default: jnp.sign,
    aten.isnan.default: jnp.isnan,
    aten.isinf.default: jnp.isinf,
}
for _op, _fn in _UNARY.items():
    LOWERINGS[_op] = _fn


@lowers(aten.gelu.default)
def _gelu(x: Any, *, approximate: str = "none") -> Any:
    return jax.nn.gelu(x, approximate=approximate == "tanh")


@lowers(aten.clamp.default)
def _clamp(x: Any, min: Any = None, max: Any = None) -> Any:  # noqa: A002 - aten's names
    return jnp.clip(x, min, max)


@lowers(aten.clamp.Tensor)
def _clamp_tensor(x: Any, min: Any = None, max: Any = None) -> Any:  # noqa: A002
    return jnp.clip(x, min, max)


@lowers(aten.where.self)
def _where(cond: Any, x: Any, y: Any) -> Any:
    x, y = _promote(x, y)
    return jnp.where(cond, x, y)


@lowers(aten.lerp.Scalar, aten.lerp.Tensor)
def _lerp(x: Any, end: Any, weight: Any) -> Any:
    return x + weight * (end - x)


@lowers(aten.addcmul.default)
def _addcmul(x: Any, a: Any, b: Any, *, value: Any = 1) -> Any:
    return x + value * a * b


@lowers(aten.addcdiv.default)
def _addcdiv(x: Any, a: Any, b: Any, *, value: Any = 1) -> Any:
    return x + value * a / b


# -- creation and conversion -----------------------------------------------------------------
@lowers(aten.full.default)
def _full(size: Sequence[int], value: Any, *, dtype: torch.dtype | None = None, **_: Any) -> Any:
    return jnp.full(tuple(size), value, dtype=jax_dtype(dtype or torch.get_default_dtype()))


@lowers(aten.scalar_tensor.default)
def _scalar_tensor(value: Any, *, dtype: torch.dtype | None = None, **_: Any) -> Any:
    return jnp.asarray(value, dtype=jax_dtype(dtype or torch.get_default_dtype()))


@lowers(aten.full_like.default)
def _full_like(x: Any, value: Any, *, dtype: torch.dtype | None = None, **_: Any) -> Any:
    return jnp.full(x.shape, value, dtype=jax_dtype(dtype) if dtype else x.dtype)


@lowers(aten.zeros_like.default, aten.empty_like.default)
def _zeros_like(x: Any, *, dtype: torch.dtype | None = None, **_: Any) -> Any:
    return jnp.zeros(x.shape, dtype=jax_dtype(dtype) if dtype else x.dtype)


@lowers(aten.ones_like.default)
def _ones_like(x: Any, *, dtype: torch.dtype | None = None, **_: Any) -> Any:
    return jnp.ones(x.shape, dtype=jax_dtype(dtype) if dtype else x.dtype)


@lowers(aten.empty.memory_format, aten.zeros.default)
def _zeros(size: Sequence[int], *, dtype: torch.dtype | None = None, **_: Any) -> Any:
    return jnp.zeros(tuple(size), dtype=jax_dtype(dtype or torch.get_default_dtype()))


@lowers(aten.empty_permuted.default)
def _empty_permuted(size: Sequence[int], order: Any, *, dtype: Any = None, **_: Any) -> Any:
    return _zeros(size, dtype=dtype)


@lowers(aten.empty_strided.default)
def _empty_strided(size: Sequence[int], stride: Any, *, dtype: Any = None, **_: Any) -> Any:
    return _zeros(size, dtype=dtype)


@lowers(aten.arange.start_step)
def _arange(start: Any, end: Any, step: Any = 1, *, dtype: torch.dtype | None = None, **_: Any):
    return jnp.arange(start, end, step, dtype=jax_dtype(dtype) if dtype else None)


@lowers(aten._to_copy.default)
def _to_copy(x: Any, *, dtype: torch.dtype | None = None, **_: Any) -> Any:
    return _as_dtype(x, dtype)


@lowers(aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default)
def _identity(x: Any, **_: Any) -> Any:
    return x


@lowers(torch.ops.prims.copy_strided.default)
def _copy_strided(x: Any, stride: Sequence[int]) -> Any:
    # A CPU layout change (a functional copy_ into a tensor laid out otherwise): an XLA array
    # has no strides.
    return x


@lowers(aten.copy.default)
def _copy(dst: Any, src: Any, non_blocking: bool = False) -> Any:
    return jnp.broadcast_to(src.astype(dst.dtype), dst.shape)


@lowers(aten.bernoulli.p)
def _bernoulli(x: Any, p: float = 0.5, *, generator: Any = None) -> Any:
    # Shape and cost only: the TPU's RNG stream is not reproduced (values come from CPU).
    key = jax.random.key(0)
    return jax.random.bernoulli(key, p, x.shape).astype(x.dtype)


# -- shape and views ---------------------------------------------------------------------------
@lowers(aten._assert_tensor_metadata.default)
def _assert_metadata(*_: Any, **__: Any) -> None:
    # export's check of a tensor's dtype/device at a conversion: no value, nothing to compute.
    return None


@lowers(aten.sym_size.int)
def _sym_size(x: Any, dim: int) -> Any:
    # A dynamic dimension is jax's symbolic size: the graph's size arithmetic (operator.mul,
    # ...) and the shape arguments it feeds stay symbolic, as export traced them.
    return x.shape[dim]


@lowers(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def _view(x: Any, size: Sequence[int]) -> Any:
    return jnp.reshape(x, tuple(size))


@lowers(aten.permute.default)
def _permute(x: Any, dims: Sequence[int]) -> Any:
    return jnp.transpose(x, tuple(dims))


@lowers(aten.expand.default)
def _expand(x: Any, size: Sequence[int], *, implicit: bool = False) -> Any:
    lead = len(size) - x.ndim
    shape = tuple(x.shape[i - lead] if s == -1 else s for i, s in enumerate(size))
    return jnp.broadcast_to(x, shape)


@lowers(aten.squeeze.dim, aten.squeeze.dims)
def _squeeze(x: Any, dim: Any) -> Any:
    dims = tuple(d for d in _dims(dim, x.ndim) if x.shape[d] == 1)
    return jnp.squeeze(x, dims) if dims else x


@lowers(aten.unsqueeze.default)
def _unsqueeze(x: Any, dim: int) -> Any:
    return jnp.expand_dims(x, dim % (x.ndim + 1))


@lowers(aten.select.int)
def _select(x: Any, dim: int, index: int) -> Any:
    return lax.index_in_dim(x, index, dim % x.ndim, keepdims=False)


@lowers(aten.slice.Tensor)
def _slice(x: Any, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> Any:
    dim %= x.ndim
    index = [slice(None)] * x.ndim
    index[dim] = slice(start, end, step)
    return x[tuple(index)]


@lowers(aten.slice_scatter.default)
def _slice_scatter(
    x: Any, src: Any, dim: int = 0, start: Any = None, end: Any = None, step: int = 1
) -> Any:
    # The backward of slicing: ``src`` written over that slice of ``x``.
    dim %= x.ndim
    index = [slice(None)] * x.ndim
    index[dim] = slice(start, end, step)
    return x.at[tuple(index)].set(src.astype(x.dtype))


@lowers(aten.select_scatter.default)
def _select_scatter(x: Any, src: Any, dim: int, index: int) -> Any:
    dim %= x.ndim
    where: list[Any] = [slice(None)] * x.ndim
    where[dim] = index
    return x.at[tuple(where)].set(src.astype(x.dtype))


@lowers(aten.cat.default)
def _cat(tensors: Sequence[Any], dim: int = 0) -> Any:
    tensors = [t for t in tensors if t.size or t.ndim > 1]
    return jnp.concatenate(_promote(*tensors), axis=dim)


@lowers(aten.split_with_sizes.default)
def _split_with_sizes(x: Any, sizes: Sequence[int], dim: int = 0) -> Any:
    return jnp.split(x, np.cumsum(sizes)[:-1].tolist(), axis=dim)


@lowers(aten.constant_pad_nd.default)
def _pad(x: Any, pad: Sequence[int], value: Any = 0) -> Any:
    widths = [(0, 0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        widths[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1], 0)
    return lax.pad(x, jnp.asarray(value, x.dtype), widths)


@lowers(aten.index.Tensor)
def _index(x: Any, indices: Sequence[Any]) -> Any:
    return x[tuple(slice(None) if i is None else i for i in indices)]


@lowers(aten.index_select.default)
def _index_select(x: Any, dim: int, index: Any) -> Any:
    return jnp.take(x, index, axis=dim)


@lowers(aten.embedding.default)
def _embedding(weight: Any, indices: Any, *_: Any) -> Any:
    return jnp.take(weight, indices, axis=0)


@lowers(aten.gather.default)
def _gather(x: Any, dim: int, index: Any, *, sparse_grad: bool = False) -> Any:
    return jnp.take_along_axis(x, index, axis=dim)


@lowers(aten.scatter_add.default)
def _scatter_add(x: Any, dim: int, index: Any, src: Any) -> Any:
    grid = list(jnp.indices(index.shape, sparse=True))
    grid[dim % x.ndim] = index
    return x.at[tuple(grid)].add(src)


@lowers(aten.scatter.value, aten.scatter.src)
def _scatter(x: Any, dim: int, index: Any, src: Any) -> Any:
    grid = list(jnp.indices(index.shape, sparse=True))
    grid[dim % x.ndim] = index
    if not hasattr(src, "shape"):
        return x.at[tuple(grid)].set(jnp.asarray(src, x.dtype))
    return x.at[tuple(grid)].set(src[tuple(slice(0, n) for n in index.shape)])


@lowers(aten.index_put.default)
def _index_put(x: Any, indices: Sequence[Any], values: Any, accumulate: bool = False) -> Any:
    where = tuple(slice(None) if i is None else i for i in indices)
    return x.at[where].add(values) if accumulate else x.at[where].set(values)


# -- reductions --------------------------------------------------------------------------------
@lowers(aten.sum.dim_IntList, aten.sum.default)
def _sum(x: Any, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Any:
    if not jnp.issubdtype(x.dtype, jnp.inexact) and dtype is None:
        dtype = torch.int64
    return jnp.sum(_as_dtype(x, dtype), axis=_dims(dim, x.ndim), keepdims=keepdim)


@lowers(aten.cumsum.default)
def _cumsum(x: Any, dim: int, *, dtype: Any = None) -> Any:
    if not jnp.issubdtype(x.dtype, jnp.inexact) and dtype is None:
        dtype = torch.int64
    return jnp.cumsum(_as_dtype(x, dtype), axis=dim % max(x.ndim, 1))


@lowers(aten.mean.dim, aten.mean.default)
def _mean(x: Any, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Any:
    return jnp.mean(_as_dtype(x, dtype), axis=_dims(dim, x.ndim), keepdims=keepdim)


@lowers(aten.prod.default, aten.prod.dim_int)
def _prod(x: Any, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Any:
    return jnp.prod(_as_dtype(x, dtype), axis=_dims(dim, x.ndim), keepdims=keepdim)


@lowers(aten.amax.default)
def _amax(x: Any, dim: Any = (), keepdim: bool = False) -> Any:
    return jnp.max(x, axis=_dims(dim, x.ndim), keepdims=keepdim)


@lowers(aten.amin.default)
def _amin(x: Any, dim: Any = (), keepdim: bool = False) -> Any:
    return jnp.min(x, axis=_dims(dim, x.ndim), keepdims=keepdim)


@lowers(aten.max.dim)
def _max_dim(x: Any, dim: int, keepdim: bool = False) -> Any:
    return jnp.max(x, axis=dim, keepdims=keepdim), jnp.argmax(x, axis=dim, keepdims=keepdim)


@lowers(aten.argmax.default)
def _argmax(x: Any, dim: Any = None, keepdim: bool = False) -> Any:
    return jnp.argmax(x, axis=dim, keepdims=keepdim)


@lowers(aten.any.default, aten.any.dim, aten.any.dims)
def _any(x: Any, dim: Any = None, keepdim: bool = False) -> Any:
    return jnp.any(x, axis=_dims(dim, x.ndim), keepdims=keepdim)


@lowers(aten.var.correction)
def _var(x: Any, dim: Any = None, *, correction: Any = None, keepdim: bool = False) -> Any:
    return jnp.var(
        x, axis=_dims(dim, x.ndim), ddof=1 if correction is None else correction, keepdims=keepdim
    )


@lowers(aten._softmax.default)
def _softmax(x: Any, dim: int, half_to_float: bool = False) -> Any:
    return jax.nn.softmax(x, axis=dim)


@lowers(aten._log_softmax.default)
def _log_softmax(x: Any, dim: int, half_to_float: bool = False) -> Any:
    return jax.nn.log_softmax(x, axis=dim)


# -- matmul, conv, norms -----------------------------------------------------------------------
@lowers(aten.mm.default, aten.bmm.default, aten.matmul.default)
def _mm(x: Any, y: Any) -> Any:
    return jnp.matmul(x, y)


@lowers(aten.addmm.default)
def _addmm(bias: Any, x: Any, y: Any, *, beta: Any = 1, alpha: Any = 1) -> Any:
    return beta * bias + alpha * jnp.matmul(x, y)


@lowers(aten.baddbmm.default)
def _baddbmm(bias: Any, x: Any, y: Any, *, beta: Any = 1, alpha: Any = 1) -> Any:
    return beta * bias + alpha * jnp.matmul(x, y)


def _conv(
    x: Any,
    w: Any,
    bias: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    transposed: bool,
    output_padding: Any,
    groups: int,
) -> Any:
    if transposed:
        raise NotImplementedError(
            "the TPU compiler layer has no lowering for transposed convolution"
        )
    n = x.ndim - 2
    spatial = "DHW"[-n:] if n else ""
    spec = ("NC" + spatial, "OI" + spatial, "NC" + spatial)
    out = lax.conv_general_dilated(
        x,
        w,
        window_strides=tuple(stride),
        padding=[(p, p) for p in padding],
        rhs_dilation=tuple(dilation),
        dimension_numbers=spec,
        feature_group_count=groups,
    )
    if bias is not None:
        out = out + bias.reshape((1, -1) + (1,) * n)
    return out


lowers(aten.convolution.default)(_conv)


@lowers(aten.convolution_backward.default)
def _conv_backward(grad: Any, x: Any, w: Any, bias_sizes: Any, *rest: Any) -> Any:
    # rest: the forward's stride ... groups, then output_mask. The gradient is the VJP of the
    # forward lowering: the same HLO XLA would build.
    *conv, output_mask = rest

    def forward(x: Any, w: Any) -> Any:
        return _conv(x, w, None, *conv)

    _, vjp = jax.vjp(forward, x, w)
    gx, gw = vjp(grad)
    gb = jnp.sum(grad, axis=(0,) + tuple(range(2, grad.ndim))) if output_mask[2] else None
    return (gx if output_mask[0] else None, gw if output_mask[1] else None, gb)


@lowers(aten.native_layer_norm.default)
def _layer_norm(x: Any, shape: Sequence[int], weight: Any, bias: Any, eps: float) -> Any:
    axes = tuple(range(x.ndim - len(shape), x.ndim))
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.var(x, axis=axes, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    out = (x - mean) * rstd
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out, mean, rstd


@lowers(aten.native_group_norm.default)
def _group_norm(
    x: Any, weight: Any, bias: Any, n: Any, c: Any, hw: Any, group: int, eps: float
) -> Any:
    # Sizes come from ``x``: under a dynamic batch ``n`` is the graph's symbolic size.
    grouped = jnp.reshape(x, (x.shape[0], group, -1))
    mean = jnp.mean(grouped, axis=2, keepdims=True)
    rstd = lax.rsqrt(jnp.var(grouped, axis=2, keepdims=True) + eps)
    out = jnp.reshape((grouped - mean) * rstd, x.shape)
    affine = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    if weight is not None:
        out = out * jnp.reshape(weight, affine)
    if bias is not None:
        out = out + jnp.reshape(bias, affine)
    return out, jnp.reshape(mean, (x.shape[0], group)), jnp.reshape(rstd, (x.shape[0], group))


def _batch_norm(
    x: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any, training: bool, eps: float
) -> tuple[Any, Any, Any, tuple[int, ...]]:
    """Normalised, scaled output with the mean and inverse std it used (batch or running)."""
    axes = (0,) + tuple(range(2, x.ndim))
    if training or running_mean is None:
        mean, rstd = jnp.mean(x, axis=axes), lax.rsqrt(jnp.var(x, axis=axes) + eps)
    else:
        mean, rstd = running_mean, lax.rsqrt(running_var + eps)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    out = (x - mean.reshape(shape)) * rstd.reshape(shape)
    if weight is not None:
        out = out * weight.reshape(shape)
    if bias is not None:
        out = out + bias.reshape(shape)
    return out, mean, rstd, axes


@lowers(aten._native_batch_norm_legit_functional.default)
def _batch_norm_functional(
    x: Any,
    weight: Any,
    bias: Any,
    running_mean: Any,
    running_var: Any,
    training: bool,
    momentum: float,
    eps: float,
) -> Any:
    out, mean, rstd, axes = _batch_norm(x, weight, bias, running_mean, running_var, training, eps)
    if not training:
        return out, mean, rstd, running_mean, running_var
    var = jnp.var(x, axis=axes)  # torch_xla's running variance follows the biased one
    new_mean = (1 - momentum) * running_mean + momentum * mean
    return out, mean, rstd, new_mean, (1 - momentum) * running_var + momentum * var


@lowers(aten.native_batch_norm.default)
def _native_batch_norm(*args: Any) -> Any:
    # Same arguments; its in-place update of the running statistics is not a graph output here
    # (the simulator records no node for it), so only the three results are lowered.
    return _batch_norm_functional(*args)[:3]


@lowers(aten._native_batch_norm_legit_no_training.default)
def _batch_norm_eval(
    x: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any, momentum: float, eps: float
) -> Any:
    return _batch_norm(x, weight, bias, running_mean, running_var, False, eps)[:3]


def _pool_windows(
    x: Any,
    kernel: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    init: Any,
    op: Callable[..., Any],
) -> Any:
    n = len(kernel)
    stride = stride or kernel
    lead = x.ndim - n
    return lax.reduce_window(
        x,
        init,
        op,
        (1,) * lead + tuple(kernel),
        (1,) * lead + tuple(stride),
        [(0, 0)] * lead + [(p, p) for p in padding],
    )


@lowers(aten.max_pool2d_with_indices.default)
def _max_pool2d(
    x: Any,
    kernel: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0, 0),
    dilation: Any = (1, 1),
    ceil_mode: bool = False,
):
    out = _pool_windows(x, kernel, stride, padding, -jnp.inf, lax.max)
    # Indices only feed the backward op, lowered below without them.
    return out, jnp.zeros(out.shape, jnp.int64)


@lowers(aten.max_pool2d_with_indices_backward.default)
def _max_pool2d_backward(
    grad: Any,
    x: Any,
    kernel: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Any,
    ceil_mode: bool,
    indices: Any,
):
    _, vjp = jax.vjp(lambda v: _pool_windows(v, kernel, stride, padding, -jnp.inf, lax.max), x)
    return vjp(grad)[0]


@lowers(aten.avg_pool2d.default)
def _avg_pool2d(
    x: Any,
    kernel: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0, 0),
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: Any = None,
) -> Any:
    total = _pool_windows(x, kernel, stride, padding, 0.0, lax.add)
    return total / (divisor_override or math.prod(kernel))
