"""Pallas TPU kernels run on the CPU by JAX's TPU interpret mode.

On a TPU, torch_xla lowers a Pallas kernel with JAX into a Mosaic payload and runs it as one
``tpu_custom_call``. Here the payload is a handle to the traced kernel itself: the custom call
runs the kernel's own code in JAX's TPU interpret mode (JAX executes its grid, block specs,
memory spaces and TPU primitives on the CPU), so what it returns is what the kernel
computes, not a stand-in (its dots rounded as the interpreter rounds them, not necessarily as
a TPU's matrix unit does).

A payload made elsewhere (Mosaic bytecode, e.g. pasted from a TPU run) cannot be interpreted:
it raises ``NotImplementedError``. Part of the optional TPU-compiler layer (the
``tpu-compiler`` extra): importing this module imports jax.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# First: jax is imported inside libtpu's load environment, and set up as the rest of the layer
# uses it (CPU platform, 64-bit integers kept).
from xlasim.runtime.compiler import libtpu  # noqa: F401

# isort: split
import jax
import ml_dtypes
import numpy as np
import torch
from jax._src import config as jax_config
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu.paged_attention import (
    paged_attention_kernel as jax_paged_attention,
)
from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel as jax_ragged_attention

from xlasim.runtime import state
from xlasim.runtime.compiler import multi_query_attention

HANDLE_PREFIX = "xlasim-pallas-kernel:"

# torch dtypes JAX takes, with the numpy type their bytes are read as (torch's numpy bridge has
# no bfloat16 or float8: those go through an integer view of the same width).
_JAX_DTYPES: dict[torch.dtype, Any] = {
    torch.float32: np.float32,
    torch.float64: np.float64,
    torch.float16: np.float16,
    torch.bfloat16: ml_dtypes.bfloat16,
    torch.int32: np.int32,
    torch.int64: np.int64,
    torch.int16: np.int16,
    torch.int8: np.int8,
    torch.uint8: np.uint8,
    torch.bool: np.bool_,
    torch.float8_e5m2: ml_dtypes.float8_e5m2,
    torch.float8_e4m3fn: ml_dtypes.float8_e4m3fn,
    torch.float8_e4m3fnuz: ml_dtypes.float8_e4m3fnuz,
}
_VIEWED = (torch.bfloat16, torch.float8_e5m2, torch.float8_e4m3fn, torch.float8_e4m3fnuz)
_BYTE_VIEWS = {1: (torch.uint8, np.uint8), 2: (torch.int16, np.int16)}
_TORCH_OF_NUMPY = {np.dtype(v): k for k, v in _JAX_DTYPES.items()}


def jax_dtype(dtype: torch.dtype) -> Any:
    """The JAX dtype of a torch dtype (``ValueError`` for one JAX has no match for)."""
    if dtype not in _JAX_DTYPES:
        raise ValueError(f"Unsupported dtype: {dtype}")
    return jax.numpy.dtype(_JAX_DTYPES[dtype])


def to_jax(t: torch.Tensor) -> jax.Array:
    t = t.detach().contiguous()
    if t.dtype in _VIEWED:
        as_int = t.view(_BYTE_VIEWS[t.element_size()][0]).numpy()
        return jax.numpy.asarray(as_int.view(_JAX_DTYPES[t.dtype]))
    return jax.numpy.asarray(t.numpy())


def to_torch(a: Any) -> torch.Tensor:
    array = np.asarray(a)
    dtype = _TORCH_OF_NUMPY.get(array.dtype)
    if dtype is None:
        raise NotImplementedError(f"xlasim: a Pallas kernel returned {array.dtype}, not simulated")
    if dtype in _VIEWED:
        numpy_int = _BYTE_VIEWS[array.itemsize][1]
        return torch.from_numpy(array.view(numpy_int).copy()).view(dtype)
    return torch.from_numpy(array.copy())


# Chips whose one device is two TensorCores (megacore): a kernel's grid dimensions marked
# "parallel" are split over both, and a kernel written for that (JAX's paged attention in
# its megacore modes) waits on both cores' DMAs, which one interpreted core never completes.
_MEGACORE = frozenset({"v4", "v5p"})


def follow_active_chip() -> None:
    """Interprets every Pallas TPU kernel of the process with the cores of the active
    simulation's device (one where none is active).

    JAX on the simulated TPU is JAX on the CPU: every Pallas TPU kernel of the process (the
    caller's own JAX code too, e.g. a reference computed with JAX's flash attention) runs in
    interpret mode, where a TPU would run it compiled. jax keeps this option in its private
    config (its public form is only the thread-local context manager); it is part of jax's
    jit keys, so a kernel traced for one chip is traced again for another."""
    runtime = state.active()
    cores = 2 if runtime is not None and runtime.spec.accelerator in _MEGACORE else 1
    wanted = pltpu.InterpretParams(num_cores_or_threads=cores)
    setting = jax_config.pallas_tpu_interpret_mode_context_manager
    if setting.get_global() != wanted:
        setting.set_global(wanted)


follow_active_chip()


@dataclass(frozen=True)
class _Traced:
    """A kernel with its call: ``args`` holds a ``jax.ShapeDtypeStruct`` where a tensor went."""

    kernel: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    static_argnums: Any
    static_argnames: Any
    # The custom call's tensors are the function's own tensor arguments and it runs the whole
    # function (the simulator's wrappers of JAX's kernels), not only its pallas_call.
    whole: bool = False


_traced: dict[str, _Traced] = {}
_bodies: dict[str, str] = {}  # call signature -> payload body
_ids = itertools.count()


def trace(
    kernel: Callable[..., Any],
    args: Sequence[Any],
    kwargs: dict[str, Any],
    static_argnums: Any = None,
    static_argnames: Any = None,
    whole: bool = False,
) -> str:
    """A payload for ``kernel`` called with ``args`` (tensors where ``torch.is_tensor``),
    shaped as torch_xla's (``{"custom_call_config": {"body": ...}}``)."""
    # Tensors as their shapes and dtypes: the kernel is traced on what trace_pallas saw, and
    # the custom call's tensors are its pallas_call's operands (which may differ, e.g. a
    # wrapper that broadcasts an argument before the call).
    template = tuple(
        jax.ShapeDtypeStruct(tuple(a.shape), jax_dtype(a.dtype)) if torch.is_tensor(a) else a
        for a in args
    )
    # The same call traced again (a kernel called every step) names the same entry, so the
    # registry grows with the distinct calls only. The kernel is held by its entry: its id
    # stays its own.
    signature = repr(
        (id(kernel), template, sorted(kwargs.items()), static_argnums, static_argnames, whole)
    )
    body = _bodies.get(signature)
    if body is None:
        body = _bodies[signature] = f"{HANDLE_PREFIX}{next(_ids)}"
        _traced[body] = _Traced(
            kernel, template, dict(kwargs), static_argnums, static_argnames, whole
        )
    return json.dumps({"custom_call_config": {"body": body, "needs_layout_passes": True}})


def _kernel_of(payload: str) -> _Traced:
    try:
        body = json.loads(payload)["custom_call_config"]["body"]
    except (ValueError, KeyError, TypeError):
        body = None
    traced = _traced.get(body) if isinstance(body, str) else None
    if traced is None:
        raise NotImplementedError(
            "xlasim runs a Pallas kernel only from the payload trace_pallas made for it in "
            "this process (it interprets the kernel's JAX code); a Mosaic payload compiled "
            "elsewhere cannot be run on the simulated TPU"
        )
    return traced


def _pallas_calls(jaxpr: Any) -> list[Any]:
    """The ``pallas_call`` equations of ``jaxpr``, nested ones (inside ``jit``) included."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            found.append(eqn)
            continue
        for param in eqn.params.values():
            inner = getattr(param, "jaxpr", param)
            if hasattr(inner, "eqns"):
                found.extend(_pallas_calls(inner))
    return found


def run(
    payload: str,
    inputs: Sequence[torch.Tensor],
    output_shapes: Sequence[Sequence[int]],
    output_dtypes: Sequence[torch.dtype],
) -> list[torch.Tensor]:
    """The kernel's outputs (CPU tensors) for ``inputs``, in interpret mode.

    As on a TPU, the custom call is the kernel's one ``pallas_call`` applied to the tensors:
    what the traced function does around it (a wrapper slicing or reshaping the kernel's
    outputs, as JAX's flash attention does) is not part of it."""
    traced = _kernel_of(payload)
    follow_active_chip()
    function = jax.jit(
        traced.kernel,
        static_argnums=traced.static_argnums,
        static_argnames=traced.static_argnames,
    )
    if traced.whole:
        values = iter(inputs)
        args = [
            to_jax(next(values)) if isinstance(a, jax.ShapeDtypeStruct) else a for a in traced.args
        ]
        result = jax.tree_util.tree_leaves(function(*args, **traced.kwargs))
        return _checked([to_torch(a) for a in result], output_shapes, output_dtypes)
    calls = _pallas_calls(function.trace(*traced.args, **traced.kwargs).jaxpr.jaxpr)
    if len(calls) != 1:
        raise NotImplementedError(
            f"xlasim runs a traced function holding one pallas_call as a TPU custom call; "
            f"this one holds {len(calls)}"
        )
    (call,) = calls
    operands = [to_jax(t) for t in inputs]
    given = [(tuple(o.shape), o.dtype) for o in operands]
    wanted = [(tuple(v.aval.shape), v.aval.dtype) for v in call.invars]
    if given != wanted:
        raise NotImplementedError(
            f"xlasim passes the custom call's tensors to the kernel's pallas_call as they are; "
            f"its operands are {wanted}, the tensors {given}"
        )
    outs = [to_torch(a) for a in call.primitive.bind(*operands, **call.params)]
    return _checked(outs, output_shapes, output_dtypes)


def _checked(
    outs: list[torch.Tensor],
    output_shapes: Sequence[Sequence[int]],
    output_dtypes: Sequence[torch.dtype],
) -> list[torch.Tensor]:
    if len(outs) != len(output_shapes):
        raise RuntimeError(
            f"the Pallas kernel returned {len(outs)} outputs, the custom call expects "
            f"{len(output_shapes)}"
        )
    checked = []
    for out, shape, dtype in zip(outs, output_shapes, output_dtypes, strict=True):
        if tuple(out.shape) != tuple(shape):
            raise RuntimeError(
                f"the Pallas kernel returned shape {tuple(out.shape)}, the custom call "
                f"declares {tuple(shape)}"
            )
        checked.append(out.to(dtype))
    return checked


def paged_attention_kernel() -> Callable[..., Any]:
    """JAX's Pallas paged-attention kernel function (what torch_xla's wrapper runs)."""
    return jax_paged_attention.paged_attention


def check_ragged_paged_attention(tensors: Sequence[torch.Tensor], **options: Any) -> None:
    """JAX's ragged paged-attention kernel's own checks of its inputs' shapes and dtypes and of
    its options, then of its head tiling (``ValueError`` with JAX's messages): what the
    kernel refuses when torch_xla traces it."""
    structs = [jax.ShapeDtypeStruct(tuple(t.shape), jax_dtype(t.dtype)) for t in tensors]
    jax_ragged_attention.static_validate_inputs(*structs, **options)
    _check_heads(structs[0], structs[1])


def _check_heads(q: Any, kv_pages: Any) -> None:
    """The kernel's refusal of head counts it cannot tile."""
    jax_ragged_attention.get_min_heads_per_blk(
        q.shape[1], kv_pages.shape[2], q.dtype, kv_pages.dtype
    )


def ragged_paged_attention(
    q: jax.Array,
    kv_pages: jax.Array,
    kv_lens: jax.Array,
    page_indices: jax.Array,
    cu_q_lens: jax.Array,
    num_seqs: jax.Array,
    *,
    sm_scale: float = 1.0,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    mask_value: float | None = jax_ragged_attention.DEFAULT_MASK_VALUE,
    k_scale: float | None = None,
    v_scale: float | None = None,
    num_kv_pages_per_block: int | None = None,
    num_queries_per_block: int | None = None,
    vmem_limit_bytes: int | None = None,
) -> jax.Array:
    """What JAX's ragged paged-attention kernel returns, for JAX arrays on the simulated TPU.

    The kernel itself runs in neither of JAX's interpret modes (it reshapes and bitcasts
    memory references, which they do not take), so the attention it defines is computed by
    JAX's own reference of it (``ref_ragged_paged_attention``), after the kernel's checks
    (block sizes only checked: they change how the kernel walks the pages, not its result).
    The result has ``q``'s shape, as the kernel's: rows past the last sequence's queries,
    which the kernel leaves unwritten, are zeros."""
    options = {
        "sm_scale": sm_scale,
        "sliding_window": sliding_window,
        "soft_cap": soft_cap,
        "mask_value": mask_value,
        "k_scale": k_scale,
        "v_scale": v_scale,
    }
    jax_ragged_attention.static_validate_inputs(
        q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs,
        num_kv_pages_per_block=num_kv_pages_per_block,
        num_queries_per_block=num_queries_per_block,
        vmem_limit_bytes=vmem_limit_bytes,
        **options,
    )  # fmt: skip
    _check_heads(q, kv_pages)
    out = jax_ragged_attention.ref_ragged_paged_attention(
        q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, **options
    )
    return jax.numpy.zeros_like(q).at[: out.shape[0]].set(out.astype(q.dtype))


# JAX's reference of the kernel, under its own name.
ref_ragged_paged_attention = jax_ragged_attention.ref_ragged_paged_attention

# The attention torch_xla's multi-query paged-attention kernel computes, as JAX code.
multi_queries_paged_attention = multi_query_attention.paged_attention
