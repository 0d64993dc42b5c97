"""Simulated ``torch_xla.experimental.pallas_kernels.ragged_paged_attention_v2``.

``ragged_paged_attention`` is a JAX function, called on JAX arrays (a reference computed
with JAX, as torch_xla's tests do). JAX ships the same kernel, and on the simulated TPU it
gives what that kernel returns (``xlasim.runtime.compiler.pallas.ragged_paged_attention``
says how). Importing this module needs JAX: the ``tpu-compiler`` extra.
"""

from __future__ import annotations

from xlasim.runtime.pallas import interpreter

_layer = interpreter()

ragged_paged_attention = _layer.ragged_paged_attention
ref_ragged_paged_attention = _layer.ref_ragged_paged_attention
