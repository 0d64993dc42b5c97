"""What changes where torch_xla runs without functionalization (``XLA_DISABLE_FUNCTIONALIZATION``).

Without it, a view op such as ``expand`` reaches torch_xla's own kernel instead of PyTorch's
functional variant, and that kernel checks its arguments with messages of its own (measured
on real torch_xla 2.9 on CPU; with functionalization on, PyTorch's checks fail first).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from xlasim.runtime.errors import xla_shape
from xlasim.runtime.settings import xla_env_flag

DISABLE_ENV = "XLA_DISABLE_FUNCTIONALIZATION"


def disabled() -> bool:
    return xla_env_flag(DISABLE_ENV)


def expand_error(t: torch.Tensor, sizes: Sequence[int]) -> str | None:
    """torch_xla's refusal of ``t.expand(sizes)``, or None where it expands."""
    sizes = [int(s) for s in sizes]
    rank = t.dim()
    if len(sizes) < rank:
        return (
            f"expand(): expected the `input` tensor {xla_shape(t)} (rank: {rank}) to have a "
            f"rank smaller or equal to the given `sizes` {sizes} (rank: {len(sizes)})."
        )
    lead = len(sizes) - rank
    for i, have in enumerate(t.shape):
        want = sizes[lead + i]
        if have != 1 and want not in (-1, have):
            return (
                f"expand(): expected dimension {lead + i} of the given `sizes` {sizes} ({want}) "
                f"to be -1, or equal to the size of the `input` tensor {xla_shape(t)} at "
                f"dimension {i} ({have})."
            )
    # A size torch_xla then builds the result's shape from: -1 keeps an existing dimension
    # only; a leading one, or any other negative size, is no dimension size at all.
    for j, want in enumerate(sizes):
        if want < -1 or (want == -1 and j < lead):
            return f"Invalid dimension size {want}, is_dynamic=false"
    return None
