"""``XLA_USE_32BIT_LONG``: 64-bit integer tensors held in 32 bits on the device.

torch_xla 2.9 still honours it (deprecated since 2.6): the device stores int64 values as s32
and uint64 as u32 while ``tensor.dtype`` keeps saying int64 / uint64, so values wrap at 32
bits after every op and transfer (2**31 + 5 comes back as -2**31 + 5), and the IR and HLO
show the 32-bit type. torch_xla reads the variable once, when the first 64-bit integer tensor
is made on a device, and prints its deprecation line to standard output then (facts recorded
from real torch_xla 2.9 on CPU). The simulator reads it per simulated runtime, at the same
moment, and wraps each value in place (a Python int an op takes is not wrapped first: for
add, sub and mul wrapping the result alone gives the same values).
"""

from __future__ import annotations

import os
import sys

import torch

from xlasim.runtime.settings import xla_env_flag

__all__ = ["LONG_DTYPES", "read_mode", "stored_dtype", "wrap_in_place"]

VARIABLE = "XLA_USE_32BIT_LONG"
_STORED = {torch.int64: torch.int32, torch.uint64: torch.uint32}
LONG_DTYPES = frozenset(_STORED)
_ANNOUNCE = "XLA_USE_32BIT_LONG will be deprecated after the 2.6 release\n"
_announced = False


def read_mode() -> bool:
    """Whether the environment asks for 32-bit longs, announced on standard output as
    torch_xla does (once per process)."""
    global _announced
    on = xla_env_flag(VARIABLE)
    if on and not _announced:
        _announced = True
        sys.stdout.flush()  # torch_xla writes from C++, straight to the descriptor
        os.write(1, _ANNOUNCE.encode())
    return on


def stored_dtype(dtype: torch.dtype, on: bool | None) -> torch.dtype:
    """The type the device holds ``dtype`` in."""
    return _STORED.get(dtype, dtype) if on else dtype


def wrap_in_place(t: torch.Tensor) -> None:
    """Wraps a 64-bit integer tensor's values to 32 bits (no-op for other dtypes)."""
    stored = _STORED.get(t.dtype)
    if stored is not None and not t.is_meta:
        t.copy_(t.to(stored))
