"""``torch_xla.backends``: the precision of float32 matmuls and convolutions.

The setting lives in the simulated runtime (``_XLAC._xla_set_mat_mul_precision``), which
computes every later f32 matmul-class op at it on a simulated TPU
(``xlasim.runtime.numerics``); the PJRT CPU client ignores it, as XLA:CPU does.
"""

from __future__ import annotations

import logging
from typing import Final, Literal

import torch_xla

__all__ = ["set_mat_mul_precision", "get_mat_mul_precision"]

logger = logging.getLogger(__name__)

_VALID: Final = ("default", "high", "highest")

# torch_xla 2.9 logs this on every set (facts: the text, its module-level name, which
# pytorch/xla's own tests read, and the logger's name).
_WARNING_MESSAGE: Final = (
    "Setting mat mul precision multiple times is not recommended. If you need to do so, "
    "please empirically verify that the precision setting is behaving as expected."
)


def set_mat_mul_precision(precision: Literal["default", "high", "highest"]) -> None:
    """Sets the precision of matmuls and convolutions on 32-bit inputs.

    On a TPU, ``default`` rounds each operand to bfloat16 (one pass), ``high`` takes three
    bfloat16 passes (about 14 bits) and ``highest`` six (about 22 bits).
    """
    if precision not in _VALID:
        raise ValueError(
            f"Invalid precision: {precision}. Must be one of {_VALID[0]}, {_VALID[1]}, {_VALID[2]}."
        )
    logger.warning(_WARNING_MESSAGE)
    torch_xla._XLAC._xla_set_mat_mul_precision(precision)


def get_mat_mul_precision() -> Literal["default", "high", "highest"]:
    """The current precision of matmuls and convolutions on 32-bit inputs."""
    precision = torch_xla._XLAC._xla_get_mat_mul_precision()
    assert precision in _VALID, (
        f"Invalid precision: {precision}. Must be one of {_VALID[0]}, {_VALID[1]}, {_VALID[2]}."
    )
    return precision
