"""``torch.ops.xla.dynamic_expand`` and ``torch.ops.xla.dynamic_view``: ``expand`` and ``view``
whose one dynamic output dimension is named by another tensor's dimension (``src_tensor``'s
``src_dim``; for a view, times ``mul_scaler``) rather than by a size in the graph.

torch_xla's export passes put them in graphs with dynamic shapes. Every backend computes them
as the ``expand``/``view`` they stand for, the simulated device included.  Defined here, once
per process (the mirrored ``torch_xla.experimental.xla_dynamic_reshape_ops`` is loaded again
for each simulation, and an op's schema can be defined only once).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

# The schemas are torch_xla's (the ops' public signatures).
_LIB = torch.library.Library("xla", "FRAGMENT")  # noqa: TOR901 - schemas need it
_LIB.define(
    "dynamic_expand(Tensor input, SymInt[] size, Tensor src_tensor, int src_dim, "
    "int target_dim) -> Tensor"
)
_LIB.define(
    "dynamic_view(Tensor input, SymInt[] size, Tensor src_tensor, int src_dim, "
    "int target_dim, float mul_scaler) -> Tensor"
)


def _sizes(size: Sequence[Any], target_dim: int, dynamic: Any) -> list[Any]:
    sizes = list(size)
    sizes[target_dim] = dynamic
    return sizes


def dynamic_expand(
    input: torch.Tensor,  # noqa: A002 - the schema's name
    size: list[Any],
    src_tensor: torch.Tensor,
    src_dim: int,
    target_dim: int,
) -> torch.Tensor:
    """``input.expand(size)`` with ``size[target_dim]`` = ``src_tensor.shape[src_dim]``."""
    return input.expand(_sizes(size, target_dim, src_tensor.shape[src_dim]))


def dynamic_expand_meta(
    input: torch.Tensor,  # noqa: A002
    size: list[Any],
    src_tensor: torch.Tensor,
    src_dim: int,
    target_dim: int,
) -> torch.Tensor:
    sizes = _sizes(size, target_dim, src_tensor.shape[src_dim])
    lead = len(sizes) - input.dim()
    shape = [input.shape[i - lead] if s == -1 else s for i, s in enumerate(sizes)]
    return input.new_empty(shape)


def dynamic_expand_xla(
    input: torch.Tensor,  # noqa: A002
    size: list[Any],
    src_tensor: torch.Tensor,
    src_dim: int,
    target_dim: int,
) -> torch.Tensor:
    # The simulated device computes the expand itself; torch_xla names this implementation.
    return dynamic_expand(input, size, src_tensor, src_dim, target_dim)


def dynamic_view(
    input: torch.Tensor,  # noqa: A002
    size: list[Any],
    src_tensor: torch.Tensor,
    src_dim: int,
    target_dim: int,
    mul_scaler: float,
) -> torch.Tensor:
    """``input.view(size)`` with ``size[target_dim]`` = ``src_tensor.shape[src_dim] *
    mul_scaler``."""
    dynamic = src_tensor.shape[src_dim] * int(mul_scaler)
    return input.view(_sizes(size, target_dim, dynamic))


def dynamic_view_meta(
    input: torch.Tensor,  # noqa: A002
    size: list[Any],
    src_tensor: torch.Tensor,
    src_dim: int,
    target_dim: int,
    mul_scaler: float,
) -> torch.Tensor:
    view = dynamic_view(input, size, src_tensor, src_dim, target_dim, mul_scaler)
    return input.new_empty(view.shape)


def dynamic_view_xla(
    input: torch.Tensor,  # noqa: A002
    size: list[Any],
    src_tensor: torch.Tensor,
    src_dim: int,
    target_dim: int,
    mul_scaler: float,
) -> torch.Tensor:
    return dynamic_view(input, size, src_tensor, src_dim, target_dim, mul_scaler)


_LIB.impl("dynamic_expand", dynamic_expand, "CompositeExplicitAutograd")
_LIB.impl("dynamic_expand", dynamic_expand_meta, "Meta")
_LIB.impl("dynamic_view", dynamic_view, "CompositeExplicitAutograd")
_LIB.impl("dynamic_view", dynamic_view_meta, "Meta")
