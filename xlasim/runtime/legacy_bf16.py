"""``XLA_USE_BF16`` / ``XLA_DOWNCAST_BF16``: floating tensors held in bfloat16 on the device.

torch_xla 2.9 still honours both (deprecated since 2.6): the device stores float32 values as
bfloat16 -- and float64 as bfloat16 (``XLA_USE_BF16``) or float32 (``XLA_DOWNCAST_BF16``) --
while ``tensor.dtype`` keeps saying float32 / float64. Every op computes in the stored type, a
Python scalar an op takes is uploaded in it too, and ``.cpu()`` gives the stored values back in
the logical dtype. torch_xla reads the variables once, when the first floating-point tensor is
made on a device, and prints its deprecation line to the process's standard output then
(facts recorded from real torch_xla 2.9 on CPU).

The simulator keeps each value in its logical dtype, rounded to the stored type after every op
and transfer: the same values, and matmuls of them (bfloat16 products, float32 sums, one
rounding) come out as a bfloat16 matmul does. It reads the variables per simulated runtime
(one per real process), so simulations in one process do not leak the mode into each other.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch

from xlasim.runtime.settings import xla_env_flag

__all__ = ["OFF", "read_mode", "round_in_place", "round_scalar", "stored_dtype"]

OFF = ""
USE_BF16 = "XLA_USE_BF16"
DOWNCAST_BF16 = "XLA_DOWNCAST_BF16"

_ANNOUNCE = {
    USE_BF16: "XLA_USE_BF16 will be deprecated after the 2.6 release, please convert your "
    "model to bf16 directly\n",
    DOWNCAST_BF16: "XLA_DOWNCAST_BF16 will be deprecated after the 2.6 release, please "
    "downcast your model directly\n",
}

# The type each logical dtype is stored in, per mode.
_STORED = {
    USE_BF16: {torch.float32: torch.bfloat16, torch.float64: torch.bfloat16},
    DOWNCAST_BF16: {torch.float32: torch.bfloat16, torch.float64: torch.float32},
}


def read_mode() -> str:
    """The mode the environment asks for (``XLA_USE_BF16`` wins when both are set), announced
    on standard output as torch_xla does."""
    global _announced
    mode = (
        USE_BF16
        if xla_env_flag(USE_BF16)
        else DOWNCAST_BF16
        if xla_env_flag(DOWNCAST_BF16)
        else OFF
    )
    if mode and not _announced:  # once per process, as torch_xla's static reading does
        _announced = True
        sys.stdout.flush()  # torch_xla writes from C++, straight to the descriptor
        os.write(1, _ANNOUNCE[mode].encode())
    return mode


_announced = False


def stored_dtype(dtype: torch.dtype, mode: str) -> torch.dtype:
    """The type the device holds values of ``dtype`` in under ``mode``."""
    return _STORED[mode].get(dtype, dtype) if mode else dtype


def round_in_place(t: torch.Tensor, mode: str) -> None:
    """Rounds ``t``'s values to the type ``mode`` stores its dtype in (no-op for other dtypes)."""
    stored = _STORED[mode].get(t.dtype)
    if stored is not None and not t.is_meta:
        t.copy_(t.to(stored))


def round_scalar(value: Any, mode: str) -> Any:
    """A Python float as the device receives it (other values as they are)."""
    if type(value) is float:
        return torch.tensor(value, dtype=torch.float32).to(torch.bfloat16).item()
    return value
