"""``xla::mark_tensor``: torch_xla's pattern-boundary marker, which tags a tensor as input or
output ``pos`` of one instance (``id``) of a pattern ``name``; torch_xla's StableHLO export
turns each marked instance into a ``stablehlo.composite``.  Defined once per process: the
mirrored ``torch_xla.experimental.xla_marker`` is loaded again for each simulation.

A mark does not change the value: every device computes it as a copy of ``x``.
"""

from __future__ import annotations

from typing import Any

import torch

_LIB = torch.library.Library("xla", "FRAGMENT")  # noqa: TOR901 - schemas need it
# torch_xla 2.9's schema (``attr`` is the pattern's attributes as a tuple of (name, value)).
_LIB.define(
    "mark_tensor(Tensor x, str name, int pos, str id, bool is_input, Any? attr=None) -> Tensor"
)


def mark_tensor(
    x: torch.Tensor,
    name: str,
    pos: int,
    id: str,  # noqa: A002 - the schema's name
    is_input: bool,
    attr: Any = None,
) -> torch.Tensor:
    return x.clone()


def mark_tensor_meta(
    x: torch.Tensor,
    name: str,
    pos: int,
    id: str,  # noqa: A002
    is_input: bool,
    attr: Any = None,
) -> torch.Tensor:
    return torch.empty_like(x)


_LIB.impl("mark_tensor", mark_tensor, "CompositeExplicitAutograd")
_LIB.impl("mark_tensor", mark_tensor_meta, "Meta")
