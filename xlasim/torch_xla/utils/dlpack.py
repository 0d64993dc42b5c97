"""Simulated ``torch_xla.utils.dlpack``: DLPack exchange is not simulated.

torch_xla hands out the device buffer itself (no copy); the simulated device has no such
buffer to share, so both directions raise instead of silently copying.
"""

from __future__ import annotations

from typing import Any


def to_dlpack(xla_tensor: Any) -> Any:
    raise NotImplementedError(
        "xlasim does not simulate DLPack export of XLA tensors (torch_xla.utils.dlpack.to_dlpack)"
    )


def from_dlpack(ext_tensor: Any) -> Any:
    raise NotImplementedError(
        "xlasim does not simulate DLPack import into XLA tensors "
        "(torch_xla.utils.dlpack.from_dlpack)"
    )
