"""Where Pallas kernels run: JAX's TPU interpret mode (``xlasim.runtime.compiler.pallas``), which
comes with the optional ``tpu-compiler`` extra. Loaded on first use, as it imports jax."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from xlasim.runtime.settings import EXTRA, INSTALL


def interpreter() -> ModuleType:
    """The interpret-mode layer, or ``NotImplementedError`` naming the extra it needs."""
    if importlib.util.find_spec("jax") is None:
        raise NotImplementedError(
            f"xlasim runs Pallas kernels with JAX's TPU interpret mode, which needs the {EXTRA} "
            f"extra (jax is not installed): {INSTALL}"
        )
    return importlib.import_module("xlasim.runtime.compiler.pallas")
