"""Where Pallas kernels run: JAX's TPU interpret mode (``xlasim.runtime.compiler.pallas``), which
comes with the optional ``tpu-compiler`` extra. Loaded on first use, as it imports jax."""

from __future__ import annotations

from types import ModuleType

from xlasim.runtime.settings import tpu_compiler_layer


def interpreter() -> ModuleType:
    """The interpret-mode layer, or ``NotImplementedError`` naming the extra it needs; set
    up for the active simulation's chip (asked for by ``jax_import_guard``, which a program
    calls before its own JAX code)."""
    layer = tpu_compiler_layer(
        "xlasim.runtime.compiler.pallas", "xlasim runs Pallas kernels with JAX's TPU interpret mode"
    )
    layer.follow_active_chip()
    return layer
