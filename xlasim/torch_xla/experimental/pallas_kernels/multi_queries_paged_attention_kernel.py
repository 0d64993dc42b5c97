"""Simulated ``torch_xla.experimental.pallas_kernels.multi_queries_paged_attention_kernel``.

``paged_attention`` is a JAX function, called on JAX arrays. torch_xla's Pallas kernel is its
own code; on the simulated TPU this is the attention it computes, written as plain JAX
(``xlasim.runtime.compiler.multi_query_attention``). Importing this module needs JAX: the
``tpu-compiler`` extra.
"""

from __future__ import annotations

from xlasim.runtime.pallas import interpreter

paged_attention = interpreter().multi_queries_paged_attention
