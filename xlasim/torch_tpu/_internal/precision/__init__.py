"""``torch.tpu.precision``: the precision of float32 matmul-class ops, as a context.

TorchTPU binds StableHLO's precision configuration (DEFAULT, HIGH, HIGHEST); the simulator
computes each at the matching level of its TPU numerics (``default``, ``high``, ``highest``),
which is the active runtime's mat-mul precision, shared with the simulated torch_xla.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Generator

from xlasim.runtime import state


class Precision(enum.Enum):
    """StableHLO's precision configuration for dot_general and convolution."""

    DEFAULT = "default"
    HIGH = "high"
    HIGHEST = "highest"


@contextlib.contextmanager
def precision(mode: Precision) -> Generator[None, None, None]:
    """Float32 matmuls and convolutions inside run at ``mode``."""
    if not isinstance(mode, Precision):
        raise ValueError(
            "expected to be one of 'PrecisionConfig.DEFAULT',"
            f" 'PrecisionConfig.HIGH', or 'PrecisionConfig.HIGHEST', got '{mode}'"
        )
    runtime = state.current()
    before = runtime.mat_mul_precision
    runtime.mat_mul_precision = mode.value
    try:
        yield
    finally:
        runtime.mat_mul_precision = before


__all__ = ["Precision", "precision"]
