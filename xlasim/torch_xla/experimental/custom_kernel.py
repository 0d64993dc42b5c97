"""Simulated ``torch_xla.experimental.custom_kernel``.

On a TPU ``flash_attention`` runs JAX's Pallas flash-attention kernel; what it returns is
ordinary attention, so the simulator computes that with ordinary ``xla`` tensor ops (the
graph, metrics and sharding then behave as for any op, and autograd gives the gradient).
The kernel's arithmetic is followed where it shows in the values: scores in float32, the
bias ``ab`` added before the ``sm_scale`` multiplication, masked scores pushed down by
adding ``DEFAULT_MASK_VALUE``, a causal mask that lets query ``i`` see keys ``0..i`` (local
positions, so it is aligned at the start when the lengths differ), the probabilities
rounded to ``v``'s dtype before they weight ``v``, and the result in ``q``'s dtype.
With ``partition_spec`` torch_xla runs the kernel on each device's shard in a manual
region; the simulator does the same, so sharding the sequence or head dimension gives the
per-shard results a TPU gives. Shapes where the TPU's answer is not plain attention (keys
padded with zeros) or where the kernel refuses them (its forward's lane tiling, its
backward's block sizes, checked when the gradient is taken) raise ``NotImplementedError``
saying why.

Pallas kernels of the caller's own (``trace_pallas``, ``make_kernel_from_pallas``) run in
JAX's TPU interpret mode where the ``tpu-compiler`` extra brings JAX
(``xlasim.runtime.compiler.pallas``). The module's other kernels (paged and ragged attention,
grouped matmul, int8 matmul) raise ``NotImplementedError`` naming themselves.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch_xla
import torch_xla.distributed.spmd as xs

from xlasim.runtime import custom_ops
from xlasim.runtime.pallas import interpreter

DEFAULT_MASK_VALUE = -0.7 * float(torch.finfo(torch.float32).max)

# Keys longer than the kernel's key block that do not fill whole blocks get zero keys (and
# zero values) appended by torch_xla before the kernel runs; without a bias those zeros
# take part in the softmax, so the result is not plain attention.
_KV_BLOCK = 512
# With segment ids the kernel tiles the query ids over lanes of this width.
_NUM_LANES = 128


def _needs_pallas(name: str) -> NotImplementedError:
    return NotImplementedError(
        f"xlasim does not simulate this Pallas TPU kernel "
        f"(torch_xla.experimental.custom_kernel.{name})"
    )


def safe_empty_like(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """An uninitialised tensor like ``tensor``, or None for None."""
    return None if tensor is None else torch.empty_like(tensor)


def generate_ctx_need_grad(*args: Any) -> list[bool]:
    """For each argument: whether it is a tensor that requires grad."""
    return [isinstance(a, torch.Tensor) and a.requires_grad for a in args]


def jax_import_guard() -> None:
    """torch_xla calls this before importing JAX so that torch_xla, not JAX, holds the TPU.
    The simulated TPU's JAX is JAX on the CPU, set up as the simulator's Pallas interpreter
    uses it; without the tpu-compiler extra there is no JAX to import, which it says here
    rather than fail later inside the caller's import."""
    interpreter()


def convert_torch_dtype_to_jax(dtype: torch.dtype) -> Any:
    return interpreter().jax_dtype(dtype)


def to_jax_shape_dtype_struct(tensor: torch.Tensor) -> Any:
    layer = interpreter()
    return layer.jax.ShapeDtypeStruct(tensor.shape, layer.jax_dtype(tensor.dtype))


# Payloads by traced call, when trace_pallas is asked to cache (torch_xla's name).
trace_pallas_arg_to_payload: dict[tuple[Any, ...], str] = {}


def trace_pallas(
    kernel: Callable[..., Any],
    *args: Any,
    static_argnums: Any = None,
    static_argnames: Any = None,
    use_cache: bool = False,
    **kwargs: Any,
) -> tuple[str, list[torch.Tensor]]:
    """(payload, tensor arguments) of ``kernel`` called with ``args``: the payload stands for
    the kernel and its non-tensor arguments, and ``_xla_tpu_custom_call`` runs it on the
    tensors in JAX's TPU interpret mode."""
    layer = interpreter()
    tensors = [a for a in args if torch.is_tensor(a)]
    key: tuple[Any, ...] = ()
    if use_cache:
        shapes = tuple((tuple(a.shape), a.dtype) if torch.is_tensor(a) else a for a in args)
        key = (
            layer.jax.config.jax_default_matmul_precision,
            kernel,
            static_argnums,
            tuple(static_argnames) if static_argnames is not None else None,
            shapes,
            repr(sorted(kwargs.items())).encode(),
        )
        if key in trace_pallas_arg_to_payload:
            torch_xla._XLAC._xla_increment_counter("trace_pallas_cache_hit", 1)
            return trace_pallas_arg_to_payload[key], tensors
    payload = layer.trace(kernel, args, kwargs, static_argnums, static_argnames)
    if use_cache:
        trace_pallas_arg_to_payload[key] = payload
    return payload, tensors


def make_kernel_from_pallas(
    kernel: Callable[..., Any], output_shape_dtype_fn: Callable[..., Any]
) -> Callable[..., Any]:
    """A function running ``kernel`` on xla tensors as one ``tpu_custom_call``;
    ``output_shape_dtype_fn(*args)`` lists its outputs' (shape, dtype)."""

    def wrapped_kernel(
        *args: Any, static_argnums: Any = None, static_argnames: Any = None, **kwargs: Any
    ) -> Any:
        payload, tensors = trace_pallas(
            kernel, *args, static_argnums=static_argnums, static_argnames=static_argnames,
            **kwargs,
        )  # fmt: skip
        outputs = output_shape_dtype_fn(*args)
        assert isinstance(outputs, list), "The output_shape_dtype_fn should return a list."
        results = torch_xla._XLAC._xla_tpu_custom_call(
            tensors, payload, [shape for shape, _ in outputs], [dtype for _, dtype in outputs]
        )
        return results[0] if len(results) == 1 else tuple(results)

    return wrapped_kernel


# -- flash attention -------------------------------------------------------------------------


def _check_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_segment_ids: torch.Tensor | None,
    kv_segment_ids: torch.Tensor | None,
    ab: torch.Tensor | None,
) -> None:
    """Refuses shapes the kernel cannot take. torch_xla hands them to the kernel unchecked
    (where they fail in the Pallas lowering), so these messages are the simulator's."""
    if (q_segment_ids is None) != (kv_segment_ids is None):
        # torch_xla's own check, before the kernel is traced.
        raise AssertionError("Both q_segment_ids and kv_segment_ids should be provided.")
    if q.dim() < 3 or k.dim() != q.dim() or v.dim() != q.dim():
        raise ValueError(
            f"flash_attention: q, k and v must be [..., num_heads, seq_len, head_dim] with the "
            f"same number of dimensions (at least 3); got {tuple(q.shape)}, {tuple(k.shape)} "
            f"and {tuple(v.shape)}"
        )
    lead = tuple(q.shape[:-2])
    if tuple(k.shape[:-2]) != lead or tuple(v.shape[:-2]) != lead:
        raise ValueError(
            f"flash_attention: q, k and v must agree in batch and head dimensions; got "
            f"{tuple(q.shape)}, {tuple(k.shape)} and {tuple(v.shape)}"
        )
    if k.shape[-1] != q.shape[-1] or v.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"flash_attention: q, k and v must have the same head_dim (last dimension); got "
            f"{q.shape[-1]}, {k.shape[-1]} and {v.shape[-1]}"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"flash_attention: k and v must have the same kv_seq_len; got {k.shape[-2]} and "
            f"{v.shape[-2]}"
        )
    q_len, kv_len = q.shape[-2], k.shape[-2]
    if ab is not None and tuple(ab.shape) != (*lead, q_len, kv_len):
        raise ValueError(
            f"flash_attention: ab must have shape {(*lead, q_len, kv_len)} "
            f"([..., num_heads, q_seq_len, kv_seq_len]); got {tuple(ab.shape)}"
        )
    if q_segment_ids is not None and kv_segment_ids is not None:
        batch = tuple(q.shape[:-3])
        if tuple(q_segment_ids.shape) != (*batch, q_len):
            raise ValueError(
                f"flash_attention: q_segment_ids must have shape {(*batch, q_len)} "
                f"([batch, q_seq_len]); got {tuple(q_segment_ids.shape)}"
            )
        if tuple(kv_segment_ids.shape) != (*batch, kv_len):
            raise ValueError(
                f"flash_attention: kv_segment_ids must have shape {(*batch, kv_len)} "
                f"([batch, kv_seq_len]); got {tuple(kv_segment_ids.shape)}"
            )


def _kernel_limit(
    q: torch.Tensor, k: torch.Tensor, segments: bool, ab: torch.Tensor | None
) -> str | None:
    """Why the TPU's forward for these shapes (as the kernel sees them, so per shard) is not
    plain attention, or the kernel refuses them; None when it is plain attention."""
    kv_len, head_dim = k.shape[-2], k.shape[-1]
    if kv_len > _KV_BLOCK and kv_len % _KV_BLOCK and ab is None:
        return (
            f"xlasim: flash_attention with kv_seq_len {kv_len} (above {_KV_BLOCK} and not a "
            f"multiple of it): torch_xla pads the keys with zeros that take part in the "
            f"kernel's softmax, which is not simulated"
        )
    # The kernel's own refusals, raised when it is traced.
    if segments and min(kv_len, _KV_BLOCK) % _NUM_LANES:
        return f"kv block size must be a multiple of {_NUM_LANES}"
    if kv_len > _KV_BLOCK and head_dim > _NUM_LANES and head_dim % _NUM_LANES:
        return f"head_dim={head_dim} should be a multiple of {_NUM_LANES} if larger"
    return None


def _backward_limit(q_len: int, kv_len: int) -> str | None:
    """Why the TPU kernel's backward refuses these sequence lengths (per shard), or None.

    torch_xla runs it with query blocks of min(len, 512) and min(len, 1024) and key blocks
    of min(len, 256) and min(len, 512), each of which must divide its length, and key blocks
    in whole 128-lane tiles."""
    key_blocks = (min(kv_len, 256), min(kv_len, _KV_BLOCK))
    query_blocks = (min(q_len, _KV_BLOCK), min(q_len, 1024))
    keys_fit = all(kv_len % b == 0 and b % _NUM_LANES == 0 for b in key_blocks)
    if keys_fit and all(q_len % b == 0 for b in query_blocks):
        return None
    return (
        f"xlasim: the gradient of flash_attention with q_seq_len {q_len} and kv_seq_len "
        f"{kv_len}: the TPU kernel's backward takes kv_seq_len 128, 256 or a multiple of 512, "
        f"and q_seq_len up to 512, 1024 or a multiple of 1024"
    )


def _not_simulated(reason: str) -> NotImplementedError:
    return NotImplementedError(reason)


def _refusing_hook(reason: str) -> Callable[[torch.Tensor], None]:
    """A gradient hook that stops the backward where the TPU kernel's backward would fail
    (the forward runs there)."""

    def refuse(grad: torch.Tensor) -> None:
        raise _not_simulated(reason)

    return refuse


def _attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    q_segment_ids: torch.Tensor | None,
    kv_segment_ids: torch.Tensor | None,
    sm_scale: float,
    ab: torch.Tensor | None,
) -> torch.Tensor:
    """softmax((q kᵀ + ab) * sm_scale + mask) v, in the kernel's order and precisions."""
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2))
    if ab is not None:
        scores = scores + ab.float()
    if sm_scale != 1.0:
        scores = scores * sm_scale
    keep: torch.Tensor | None = None
    if q_segment_ids is not None and kv_segment_ids is not None:
        # [..., 1, q_len, 1] == [..., 1, 1, kv_len]: one mask for every head.
        keep = q_segment_ids.unsqueeze(-1).unsqueeze(-3) == kv_segment_ids.unsqueeze(-2).unsqueeze(
            -3
        )
    if causal:
        q_len, kv_len = scores.shape[-2], scores.shape[-1]
        rows = torch.arange(q_len, device=q.device).unsqueeze(-1)
        cols = torch.arange(kv_len, device=q.device).unsqueeze(0)
        seen = cols <= rows
        keep = seen if keep is None else torch.logical_and(keep, seen)
    if keep is not None:
        scores = scores + torch.where(keep, 0.0, DEFAULT_MASK_VALUE)
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs.to(v.dtype).float(), v.float())
    return out.to(q.dtype)


def _global_shape(local: torch.Size, spec: Sequence[Any], mesh: xs.Mesh) -> tuple[int, ...]:
    """The full shape whose shards under ``spec`` are ``local`` (each sharded dimension
    times the sizes of its mesh axes)."""
    sizes = mesh.shape()
    full = []
    for size, axes in zip(local, spec, strict=False):
        names = () if axes is None else (axes,) if isinstance(axes, (str, int)) else axes
        for axis in names:
            size *= sizes[axis] or 1
        full.append(size)
    return tuple(full)


def _to_shards(args: Sequence[Any], specs: Sequence[Any] | None, mesh: xs.Mesh | None) -> list[Any]:
    """Each device's shard of the tensors among ``args`` (manual sharding), or ``args`` as
    they are without specs."""
    if specs is None:
        return list(args)
    shards = []
    for i, (a, spec) in enumerate(zip(args, specs, strict=True)):
        if isinstance(a, torch.Tensor):
            if a.dim() != len(spec):
                # torch_xla's own check (an assert) before the kernel runs.
                raise AssertionError(f"{i}th input has wrong shape: {a.shape} for {spec}")
            a = xs.enable_manual_sharding(a, spec, mesh=mesh).global_tensor
        shards.append(a)
    return shards


def _to_full(t: torch.Tensor, spec: Sequence[Any] | None, mesh: xs.Mesh | None) -> torch.Tensor:
    """The devices' results of a manual region as one tensor sharded by ``spec``."""
    if spec is None or mesh is None:
        return t
    full = _global_shape(t.shape, spec, mesh)
    out: torch.Tensor = xs.disable_manual_sharding(
        t, spec, torch.Size(full), mesh=mesh
    ).global_tensor
    return out


def _input_specs(partition_spec: Sequence[Any] | None) -> tuple[Any, ...] | None:
    """Per argument of ``_attention`` (q, k, v, q_segment_ids, kv_segment_ids, ab): its
    spec; the segment ids take the batch and sequence axes."""
    if partition_spec is None:
        return None
    spec = tuple(partition_spec)
    segments = (spec[0], spec[1], spec[3]) if len(spec) == 5 else (spec[0], spec[2])
    return (spec, spec, spec, segments, segments, spec)


# Where each of ``_attention``'s tensors sits among ``FlashAttention.apply``'s arguments.
_APPLY_POSITION = (0, 1, 2, 4, 5, 7)


class FlashAttention(torch.autograd.Function):
    """``flash_attention`` as an autograd function: ``FlashAttention.apply(q, k, v, causal,
    q_segment_ids, kv_segment_ids, sm_scale, ab, partition_spec, mesh)``. With a
    ``partition_spec`` forward and backward each run on the devices' shards (over ``mesh``),
    as torch_xla's kernels do; the backward differentiates the attention's ops there."""

    MIN_BLOCK_SIZE = 128
    DEFAULT_MASK_VALUE = DEFAULT_MASK_VALUE
    DEFAULT_BLOCK_SIZES = {
        "block_q": 512,
        "block_k_major": 512,
        "block_k": 512,
        "block_b": 2,
        "block_q_major_dkv": 512,
        "block_k_major_dkv": 512,
        "block_q_dkv": 512,
        "block_k_dkv": 512,
        "block_q_dq": 1024,
        "block_k_dq": 256,
        "block_k_major_dq": 512,
    }
    NUM_LANES = _NUM_LANES
    NUM_SUBLANES = 8

    @staticmethod
    def prepare_segment_ids(q_segment_ids: Any, kv_segment_ids: Any) -> Any:
        raise _needs_pallas("FlashAttention.prepare_segment_ids")

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        causal: bool,
        q_segment_ids: torch.Tensor | None,
        kv_segment_ids: torch.Tensor | None,
        sm_scale: float,
        ab: torch.Tensor | None,
        partition_spec: Sequence[Any] | None,
        mesh: xs.Mesh | None,
    ) -> torch.Tensor:
        _check_inputs(q, k, v, q_segment_ids, kv_segment_ids, ab)
        if partition_spec is not None:
            # torch_xla prefers the global mesh to the one passed.
            mesh = xs.get_global_mesh() or mesh
        specs = _input_specs(partition_spec)
        tensors = (q, k, v, q_segment_ids, kv_segment_ids, ab)
        local = _to_shards(tensors, specs, mesh)
        reason = _kernel_limit(local[0], local[1], local[3] is not None, local[5])
        if reason is not None:
            raise _not_simulated(reason)
        out = _attention(
            local[0], local[1], local[2], causal, local[3], local[4], sm_scale, local[5]
        )
        ctx.save_for_backward(*tensors)
        ctx.attention = (causal, sm_scale, specs, mesh)
        return _to_full(out, None if specs is None else specs[0], mesh)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:
        causal, sm_scale, specs, mesh = ctx.attention
        saved = ctx.saved_tensors
        out_spec = None if specs is None else specs[0]
        grad_local = _to_shards([grad_output], None if specs is None else [out_spec], mesh)[0]
        local = _to_shards(saved, specs, mesh)
        reason = _backward_limit(local[0].shape[-2], local[1].shape[-2])
        if reason is not None:
            raise _not_simulated(reason)
        wanted = [i for i, at in enumerate(_APPLY_POSITION) if ctx.needs_input_grad[at]]
        with torch.enable_grad():
            leaves: list[Any] = [
                t.detach().requires_grad_(i in wanted) if t is not None else None
                for i, t in enumerate(local)
            ]
            q, k, v, q_segment_ids, kv_segment_ids, ab = leaves
            out = _attention(q, k, v, causal, q_segment_ids, kv_segment_ids, sm_scale, ab)
            grads = torch.autograd.grad(out, [leaves[i] for i in wanted], grad_local)
        result: list[Any] = [None] * 10
        for i, g in zip(wanted, grads, strict=True):
            result[_APPLY_POSITION[i]] = _to_full(g, out_spec, mesh)
        return tuple(result)


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    q_segment_ids: torch.Tensor | None = None,
    kv_segment_ids: torch.Tensor | None = None,
    sm_scale: float = 1.0,
    *,
    ab: torch.Tensor | None = None,
    partition_spec: Sequence[Any] | None = None,
    mesh: xs.Mesh | None = None,
) -> torch.Tensor:
    """Attention of ``q`` [batch, num_heads, q_seq_len, head_dim] over ``k``, ``v`` [batch,
    num_heads, kv_seq_len, head_dim]: softmax((q kᵀ + ab) * sm_scale) v, with the causal and
    segment-id masks. With ``partition_spec`` (over the global mesh if one is set, else
    ``mesh``) each device attends within its own shard and the result carries that spec."""
    if partition_spec is None:
        # Autograd runs straight through the attention's ops.
        _check_inputs(q, k, v, q_segment_ids, kv_segment_ids, ab)
        reason = _kernel_limit(q, k, q_segment_ids is not None, ab)
        if reason is not None:
            raise _not_simulated(reason)
        out = _attention(q, k, v, causal, q_segment_ids, kv_segment_ids, sm_scale, ab)
        refused = _backward_limit(q.shape[-2], k.shape[-2])
        if out.requires_grad and refused is not None:
            out.register_hook(_refusing_hook(refused))
        return out
    sharded: torch.Tensor = FlashAttention.apply(
        q, k, v, causal, q_segment_ids, kv_segment_ids, sm_scale, ab, partition_spec, mesh
    )
    return sharded


def fa_custom_forward_fake(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    q_segment_ids: torch.Tensor | None,
    kv_segment_ids: torch.Tensor | None,
    sm_scale: float,
    ab: torch.Tensor | None,
    partition_spec: str | None,
    mesh: str | None,
    ctx_grad: list[bool],
) -> tuple[torch.Tensor | None, ...]:
    """The shapes torch_xla's forward op reports when traced with fake tensors: the output
    and the saved q, k, v, two residuals and ab, all uninitialised."""
    assert q.shape == k.shape == v.shape
    residual = torch.empty_like(q[:3])
    return (
        torch.empty_like(v),
        torch.empty_like(q),
        torch.empty_like(k),
        torch.empty_like(v),
        residual,
        torch.empty_like(residual),
        safe_empty_like(ab),
    )


def fa_custom_backward_fake(
    grad_output: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *rest: Any,
) -> tuple[torch.Tensor | None, ...]:
    """The shapes torch_xla's backward op reports when traced with fake tensors: uninitialised
    gradients like q, k, v and ab."""
    ab = rest[5]
    return tuple(safe_empty_like(t) for t in (q, k, v, ab))


def non_xla_attetion(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attention_type: str
) -> torch.Tensor:
    """What an attention op gives off the XLA device (dynamo's fake tensors): an
    uninitialised tensor shaped like ``q``; a warning unless ``k`` is a meta tensor."""
    if k.device != torch.device("meta"):
        warnings.warn(
            f"XLA {attention_type} attention should only be applied to tensors on XLA device",
            stacklevel=2,
        )
    return torch.empty_like(q)


def flash_attention_xla(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False
) -> torch.Tensor:
    """The XLA kernel of the ``xla::flash_attention`` op: ``flash_attention``."""
    return flash_attention(q, k, v, causal=causal)


def flash_attention_non_xla(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False
) -> torch.Tensor:
    """The ``xla::flash_attention`` op off the XLA device (see ``non_xla_attetion``)."""
    return non_xla_attetion(q, k, v, "flash")


def repeat_with_fixed_output_size(
    input: torch.Tensor,  # noqa: A002 - torch_xla's name
    repeats: torch.Tensor,
    total_repeat_length: int,
) -> torch.Tensor:
    """``input[i]`` repeated ``repeats[i]`` times, cut or padded (with the last element) to
    ``total_repeat_length`` values. Plain tensor ops in torch_xla too, so computed here."""
    assert input.dim() == 1
    assert repeats.dim() == 1
    # Output position p takes the first element whose repeats end after p: its index is the
    # count of elements ending at or before p. Counted with a comparison and a sum, ops
    # torch_xla lowers (searchsorted would be a CPU fallback, which torch_xla's has none of).
    ends = torch.cumsum(repeats, dim=0)
    positions = torch.arange(total_repeat_length, device=input.device, dtype=ends.dtype)
    index = (ends.unsqueeze(0) <= positions.unsqueeze(1)).sum(dim=1)
    index = torch.clamp(index, max=input.shape[0] - 1)
    return torch.gather(input, 0, index)


# -- kernels that only exist as Pallas code -------------------------------------------------


def paged_attention(
    q: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    lengths: torch.Tensor,
    page_indices: torch.Tensor,
    pages_per_compute_block: int,
    megacore_mode: str | None = None,
    attn_logits_soft_cap: float | None = None,
) -> torch.Tensor:
    """Decode attention over paged keys and values: JAX's Pallas paged-attention kernel, run
    in JAX's TPU interpret mode as one ``tpu_custom_call`` (the tpu-compiler extra)."""
    assert megacore_mode in ["kv_head", "batch", None], (
        "megacore_mode must be one of ['kv_head', 'batch', None]."
    )
    layer = interpreter()
    payload = layer.trace(
        layer.paged_attention_kernel(),
        (q, k_pages, v_pages, lengths, page_indices),
        {
            "pages_per_compute_block": pages_per_compute_block,
            "megacore_mode": megacore_mode,
            "attn_logits_soft_cap": attn_logits_soft_cap,
        },
        static_argnames=["pages_per_compute_block", "megacore_mode", "attn_logits_soft_cap"],
        whole=True,
    )
    (out,) = torch_xla._XLAC._xla_tpu_custom_call(
        [q, k_pages, v_pages, lengths, page_indices], payload, [q.shape], [q.dtype]
    )
    return out


def paged_attention_xla(
    q: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    lengths: torch.Tensor,
    page_indices: torch.Tensor,
    pages_per_compute_block: int,
    megacore_mode: str | None = None,
    attn_logits_soft_cap: float | None = None,
) -> torch.Tensor:
    """The XLA kernel of the ``xla::paged_attention`` op: ``paged_attention``."""
    return paged_attention(
        q, k_pages, v_pages, lengths, page_indices, pages_per_compute_block, megacore_mode,
        attn_logits_soft_cap,
    )  # fmt: skip


def paged_attention_non_xla(
    q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, *args: Any, **kwargs: Any
) -> torch.Tensor:
    """The ``xla::paged_attention`` op off the XLA device (see ``non_xla_attetion``)."""
    return non_xla_attetion(q, k_pages, v_pages, "paged")


def multi_queries_paged_attention(
    q: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    lengths: torch.Tensor,
    page_indices: torch.Tensor,
    effective_q_lens: torch.Tensor,
    num_kv_pages_per_compute_block: int,
    num_queries_per_compute_block: int,
    use_kernel: bool = True,
    attn_logits_soft_cap: float | None = None,
) -> torch.Tensor:
    """Paged attention of several queries per sequence, ``q`` [batch, query_len, num_heads,
    head_dim] over ``k_pages``/``v_pages`` [num_kv_heads, pages, page_size, head_dim].

    ``use_kernel=True`` is torch_xla's Pallas kernel: one ``tpu_custom_call`` running the
    attention it computes as JAX code (``xlasim.runtime.compiler.multi_query_attention``, the
    tpu-compiler extra). ``use_kernel=False`` is torch_xla's op-by-op path: the same
    attention with tensor ops, products in the inputs' dtype and softmax in float32."""
    assert len(q.shape) == 4, "q should have 4 dimensions."
    if not use_kernel:
        return _multi_query_attention(
            q, k_pages, v_pages, lengths, page_indices, effective_q_lens, attn_logits_soft_cap
        )
    layer = interpreter()
    tensors = [q, k_pages, v_pages, lengths, page_indices, effective_q_lens]
    # Static in the traced function: they shape the computation.
    options = {
        "attn_logits_soft_cap": attn_logits_soft_cap,
        "num_queries_per_compute_block": num_queries_per_compute_block,
        "num_kv_pages_per_compute_block": num_kv_pages_per_compute_block,
    }
    payload = layer.trace(
        layer.multi_queries_paged_attention,
        tensors,
        options,
        static_argnames=list(options),
        whole=True,
    )
    (out,) = torch_xla._XLAC._xla_tpu_custom_call(tensors, payload, [q.shape], [q.dtype])
    return out


def _multi_query_attention(
    q: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    lengths: torch.Tensor,
    page_indices: torch.Tensor,
    effective_q_lens: torch.Tensor,
    soft_cap: float | None,
) -> torch.Tensor:
    """Per batch entry: its rows ``r`` at positions ``lengths[b] - effective_q_lens[b] + r``
    see the keys up to their own among the entry's first ``lengths[b]`` positions."""
    batch, query_len, heads, head_dim = q.shape
    kv_heads, _, page_size, _ = k_pages.shape
    group = heads // kv_heads
    kv_lens = [int(n) for n in lengths.cpu()]
    visible = [int(n) for n in (lengths - effective_q_lens).cpu()]
    rows = []
    for b in range(batch):
        pages = page_indices[b, : -(-kv_lens[b] // page_size)]
        # [kv_heads, pages, page_size, d] -> [kv_heads, kv_len, d]
        keys = k_pages[:, pages].reshape(kv_heads, -1, head_dim)[:, : kv_lens[b]]
        values = v_pages[:, pages].reshape(kv_heads, -1, head_dim)[:, : kv_lens[b]]
        queries = q[b].reshape(query_len, kv_heads, group, head_dim)
        scores = torch.einsum("qhgd,hkd->hgqk", queries, keys)
        if soft_cap is not None:
            scores = torch.tanh(scores / soft_cap) * soft_cap
        last = torch.arange(query_len, device=q.device).unsqueeze(1) + visible[b]
        hidden = torch.arange(kv_lens[b], device=q.device).unsqueeze(0) > last
        probs = torch.softmax(scores.float().masked_fill(hidden, float("-inf")), dim=-1)
        out = torch.einsum("hgqk,hkd->qhgd", probs.to(values.dtype), values)
        rows.append(out.reshape(query_len, heads, head_dim))
    return torch.stack(rows)


def multi_queries_paged_attention_xla(
    q: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    lengths: torch.Tensor,
    page_indices: torch.Tensor,
    effective_q_lens: torch.Tensor,
    num_kv_pages_per_compute_block: int,
    num_queries_per_compute_block: int,
    use_kernel: bool,
    attn_logits_soft_cap: float | None = None,
) -> torch.Tensor:
    """The XLA kernel of the ``xla::multi_queries_paged_attention`` op."""
    return multi_queries_paged_attention(
        q, k_pages, v_pages, lengths, page_indices, effective_q_lens,
        num_kv_pages_per_compute_block, num_queries_per_compute_block, use_kernel,
        attn_logits_soft_cap,
    )  # fmt: skip


def multi_queries_paged_attention_non_xla(
    q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, *args: Any, **kwargs: Any
) -> torch.Tensor:
    """The ``xla::multi_queries_paged_attention`` op off the XLA device."""
    return non_xla_attetion(q, k_pages, v_pages, "paged")


def ragged_paged_attention(
    q: torch.Tensor,
    kv_pages: torch.Tensor,
    kv_lens: torch.Tensor,
    page_indices: torch.Tensor,
    cu_q_lens: torch.Tensor,
    num_seqs: torch.Tensor,
    *,
    sm_scale: float = 1.0,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    mask_value: float | None = None,
    k_scale: float | None = None,
    v_scale: float | None = None,
    use_kernel: bool = True,
    num_kv_pages_per_block: int | None = None,
    num_queries_per_block: int | None = None,
    vmem_limit_bytes: int | None = None,
) -> torch.Tensor:
    """Attention of a batch of sequences of any lengths (prefill and decode mixed) over paged,
    interleaved keys and values; see ``ragged_attention`` for the layout and masks.

    ``use_kernel=False`` is torch_xla's op-by-op path: it checks the lengths at run time and
    returns the sequences' queries' rows only, computed in the inputs' dtypes.
    ``use_kernel=True`` is JAX's Pallas kernel, which cannot run in JAX's interpret modes: its
    checks are JAX's own, and what it returns (``q``'s shape, scores and softmax in float32)
    is computed with tensor ops, rows past the last sequence's queries zero."""
    if mask_value is None:
        mask_value = DEFAULT_MASK_VALUE
    tensors = (q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs)
    options: dict[str, Any] = {
        "sm_scale": sm_scale,
        "sliding_window": sliding_window,
        "soft_cap": soft_cap,
        "mask_value": mask_value,
        "k_scale": k_scale,
        "v_scale": v_scale,
    }
    if not use_kernel:
        _check_ragged_lengths(tensors)
        return torch.cat(ragged_attention(tensors, scores_dtype=None, **options))
    interpreter().check_ragged_paged_attention(
        tensors,
        num_kv_pages_per_block=num_kv_pages_per_block,
        num_queries_per_block=num_queries_per_block,
        vmem_limit_bytes=vmem_limit_bytes,
        **options,
    )
    rows = ragged_attention(tensors, scores_dtype=torch.float32, **options)
    written = sum(r.shape[0] for r in rows)
    rest = q.new_zeros((q.shape[0] - written, *q.shape[1:]))
    return torch.cat([*rows, rest])


def _check_ragged_lengths(tensors: Sequence[torch.Tensor]) -> None:
    """torch_xla's run-time checks of the lengths (its ``ValueError`` texts)."""
    q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs = tensors
    max_num_batched_tokens = q.shape[0]
    page_size = kv_pages.shape[1]
    max_num_seqs, pages_per_seq = page_indices.shape
    count = num_seqs[0]
    if count > max_num_seqs:
        raise ValueError(f"num_seqs[0]={count!r} must be less or equal to {max_num_seqs=}")
    max_kv_len = torch.max(kv_lens)
    min_pages_per_seq = (max_kv_len + page_size - 1) // page_size
    if pages_per_seq < min_pages_per_seq:
        raise ValueError(
            f"{pages_per_seq=} must be greater or equal to {min_pages_per_seq=} given "
            f"{max_kv_len=} and {page_size=}."
        )
    total = cu_q_lens[count]
    if total > max_num_batched_tokens:
        raise ValueError(
            f"Total q tokens {total} must be less or equal to {max_num_batched_tokens=}."
        )
    for i in range(int(count)):
        q_len = cu_q_lens[i + 1] - cu_q_lens[i]
        kv_len = kv_lens[i]
        if q_len > kv_len:
            raise ValueError(f"{q_len=} must be less or equal to {kv_len=} at sequence {i}.")


def ragged_attention(
    tensors: Sequence[torch.Tensor],
    *,
    sm_scale: float,
    sliding_window: int | None,
    soft_cap: float | None,
    mask_value: float,
    k_scale: float | None,
    v_scale: float | None,
    scores_dtype: torch.dtype | None,
) -> list[torch.Tensor]:
    """Each sequence's attention output rows [q_len, num_q_heads, head_dim], in ``q``'s dtype.

    Sequence ``i`` owns the query rows ``cu_q_lens[i]:cu_q_lens[i + 1]`` (its last tokens)
    and the first ``kv_lens[i]`` positions of the pages ``page_indices[i]`` (``kv_pages`` is
    [pages, page_size, 2 * num_kv_heads, head_dim], keys and values interleaved on the head
    axis; query head ``h`` reads key/value head ``h // (num_q_heads // num_kv_heads)``). A
    query sees the keys up to its own position, and with ``sliding_window`` only the last
    ``sliding_window`` of them. Scores are ``q kᵀ * sm_scale``, soft-capped as
    ``soft_cap * tanh(s / soft_cap)``, masked with ``mask_value``; keys and values are first
    multiplied by ``k_scale`` / ``v_scale`` in float32 and rounded to ``q``'s dtype. The
    scores are computed in ``scores_dtype`` (the inputs' dtype for None) and the
    probabilities rounded to the values' dtype before they weight them. ``tensors`` are
    ``ragged_paged_attention``'s (q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs)."""
    q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs = tensors
    page_size, combined_heads, head_dim = kv_pages.shape[1:]
    kv_heads = combined_heads // 2
    group = q.shape[1] // kv_heads
    bounds = [int(b) for b in cu_q_lens[: int(num_seqs[0]) + 1].cpu()]
    lengths = [int(n) for n in kv_lens.cpu()]
    outputs = []
    for i, (start, end) in enumerate(itertools.pairwise(bounds)):
        q_len, kv_len = end - start, lengths[i]
        pages = page_indices[i, : -(-kv_len // page_size)]
        kv = kv_pages[pages].reshape(-1, combined_heads, head_dim)[:kv_len]
        keys, values = kv[:, 0::2], kv[:, 1::2]
        if k_scale is not None:
            keys = (keys.float() * k_scale).to(q.dtype)
        if v_scale is not None:
            values = (values.float() * v_scale).to(q.dtype)
        queries = q[start:end].reshape(q_len, kv_heads, group, head_dim)
        dtype = scores_dtype or queries.dtype
        scores = torch.einsum("qhgd,khd->hgqk", queries.to(dtype), keys.to(dtype)) * sm_scale
        if soft_cap is not None:
            scores = torch.tanh(scores / soft_cap) * soft_cap
        # Query row r sits at position kv_len - q_len + r of its sequence.
        position = torch.arange(q_len, device=q.device).unsqueeze(1) + (kv_len - q_len)
        key = torch.arange(kv_len, device=q.device).unsqueeze(0)
        hidden = key > position
        if sliding_window is not None:
            hidden = hidden | (key <= position - sliding_window)
        probs = torch.softmax(scores.masked_fill(hidden, mask_value), dim=-1).to(values.dtype)
        out = torch.einsum("hgqk,khd->qhgd", probs.to(dtype), values.to(dtype))
        outputs.append(out.reshape(q_len, -1, head_dim).to(q.dtype))
    return outputs


def ragged_paged_attention_xla(
    q: torch.Tensor,
    kv_pages: torch.Tensor,
    kv_lens: torch.Tensor,
    page_indices: torch.Tensor,
    cu_q_lens: torch.Tensor,
    num_seqs: torch.Tensor,
    sm_scale: float = 1.0,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    mask_value: float | None = None,
    k_scale: float | None = None,
    v_scale: float | None = None,
    use_kernel: bool = True,
    num_kv_pages_per_block: int | None = None,
    num_queries_per_block: int | None = None,
    vmem_limit_bytes: int | None = None,
) -> torch.Tensor:
    """The XLA kernel of the ``xla::ragged_paged_attention`` op (the op's positional
    arguments): ``ragged_paged_attention``."""
    return ragged_paged_attention(
        q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, sm_scale=sm_scale,
        sliding_window=sliding_window, soft_cap=soft_cap, mask_value=mask_value,
        k_scale=k_scale, v_scale=v_scale, use_kernel=use_kernel,
        num_kv_pages_per_block=num_kv_pages_per_block,
        num_queries_per_block=num_queries_per_block, vmem_limit_bytes=vmem_limit_bytes,
    )  # fmt: skip


def non_xla_ragged_paged_attention(
    q: torch.Tensor, kv: torch.Tensor, attention_type: str
) -> torch.Tensor:
    """What the ragged op gives off the XLA device (see ``non_xla_attetion``)."""
    return non_xla_attetion(q, kv, kv, attention_type)


def ragged_paged_attention_non_xla(
    q: torch.Tensor, kv_pages: torch.Tensor, *args: Any, **kwargs: Any
) -> torch.Tensor:
    """The ``xla::ragged_paged_attention`` op off the XLA device."""
    return non_xla_ragged_paged_attention(q, kv_pages, "paged")


def quantized_matmul_int8(*args: Any, **kwargs: Any) -> torch.Tensor:
    raise _needs_pallas("quantized_matmul_int8")


def quantized_matmul_int8_xla(*args: Any, **kwargs: Any) -> torch.Tensor:
    raise _needs_pallas("quantized_matmul_int8_xla")


def quantized_matmul_int8_non_xla(*args: Any, **kwargs: Any) -> torch.Tensor:
    raise _needs_pallas("quantized_matmul_int8_non_xla")


def gmm(*args: Any, **kwargs: Any) -> torch.Tensor:
    raise _needs_pallas("gmm")


def tgmm(*args: Any, **kwargs: Any) -> torch.Tensor:
    raise _needs_pallas("tgmm")


def gmm_backward(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    raise _needs_pallas("gmm_backward")


def gmm_xla(*args: Any, **kwargs: Any) -> torch.Tensor:
    raise _needs_pallas("gmm_xla")


def gmm_non_xla(*args: Any, **kwargs: Any) -> torch.Tensor:
    raise _needs_pallas("gmm_non_xla")


class GMM(torch.autograd.Function):
    """Grouped matmul as an autograd function; its kernels are Pallas code."""

    @staticmethod
    def forward(ctx: Any, *args: Any) -> torch.Tensor:
        raise _needs_pallas("GMM")

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        raise _needs_pallas("GMM")


# What the ``xla::`` kernel ops (``xlasim.runtime.custom_ops``) run on the simulated device.
_DEVICE_KERNELS: dict[str, Callable[..., torch.Tensor]] = {
    "flash_attention": flash_attention_xla,
    "paged_attention": paged_attention_xla,
    "multi_queries_paged_attention": multi_queries_paged_attention_xla,
    "ragged_paged_attention": ragged_paged_attention_xla,
    "gmm": gmm_xla,
    "quantized_matmul_int8": quantized_matmul_int8_xla,
}
for _op, _kernel in _DEVICE_KERNELS.items():
    custom_ops.set_device_kernel(_op, _kernel)
