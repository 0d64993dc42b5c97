"""Multi-query paged attention as a JAX function: the attention torch_xla's Pallas kernel
``multi_queries_paged_attention_kernel.paged_attention`` computes (the kernel is torch_xla's
own, not JAX's), written from its documented semantics.

Each batch entry ``b`` holds ``query_len`` query rows, of which the first
``effective_q_lens[b]`` are its last tokens: row ``r`` sits at position
``lengths[b] - effective_q_lens[b] + r`` and sees the keys up to it among the first
``lengths[b]`` positions of its pages ``page_indices[b]``. Query head ``h`` reads key/value
head ``h // (num_heads // num_kv_heads)``. Scores and softmax are float32, with float32
products (a Pallas kernel's dots on float32 take them whole). Part of the optional
TPU-compiler layer: importing this module imports jax.
"""

from __future__ import annotations

import functools

# jax as the rest of the layer sets it up (see libtpu).
from xlasim.runtime.compiler import libtpu  # noqa: F401

# isort: split
import jax
import jax.numpy as jnp

_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


# The options that shape the computation, static under jit.
_STATIC = (
    "attn_logits_soft_cap",
    "num_queries_per_compute_block",
    "num_kv_pages_per_compute_block",
)


@functools.partial(jax.jit, static_argnames=_STATIC)
def paged_attention(
    q: jax.Array,  # [batch, query_len, num_heads, head_dim]
    k_pages: jax.Array,  # [num_kv_heads, total_pages, page_size, head_dim]
    v_pages: jax.Array,  # [num_kv_heads, total_pages, page_size, head_dim]
    lengths: jax.Array,  # i32[batch]
    page_indices: jax.Array,  # i32[batch, pages_per_sequence]
    effective_q_lens: jax.Array,  # i32[batch]
    *,
    num_kv_pages_per_compute_block: int,
    num_queries_per_compute_block: int,
    attn_logits_soft_cap: float | None = None,
) -> jax.Array:
    """The attention of ``q`` over its paged keys and values, shaped like ``q``; the block
    sizes only choose how the kernel walks the pages and queries."""
    batch, query_len, heads, head_dim = q.shape
    kv_heads = k_pages.shape[0]
    group = heads // kv_heads

    def gathered(pages: jax.Array) -> jax.Array:
        # [kv_heads, batch, pages_per_sequence, page_size, d] -> [batch, kv_heads, keys, d]
        per_batch = pages[:, page_indices]
        return per_batch.reshape(kv_heads, batch, -1, head_dim).transpose(1, 0, 2, 3)

    keys, values = gathered(k_pages), gathered(v_pages)
    grouped = q.reshape(batch, query_len, kv_heads, group, head_dim)
    highest = jax.lax.Precision.HIGHEST
    scores = jnp.einsum(
        "bqhgd,bhkd->bhgqk", grouped, keys, precision=highest, preferred_element_type=jnp.float32
    )
    if attn_logits_soft_cap is not None:
        scores = jnp.tanh(scores / attn_logits_soft_cap) * attn_logits_soft_cap
    key = jnp.arange(keys.shape[2])
    last = (lengths - effective_q_lens)[:, None] + jnp.arange(query_len)[None, :]  # [b, q]
    seen = (key[None, None, :] <= last[:, :, None]) & (key < lengths[:, None, None])
    scores = jnp.where(seen[:, None, None], scores, _MASK_VALUE)
    probs = jax.nn.softmax(scores, axis=-1).astype(values.dtype)
    out = jnp.einsum(
        "bhgqk,bhkd->bqhgd", probs, values, precision=highest, preferred_element_type=jnp.float32
    )
    return out.reshape(q.shape).astype(q.dtype)
