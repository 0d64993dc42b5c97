"""``torch_xla.experimental.xla_dynamic_reshape_ops``: ``torch.ops.xla.dynamic_expand`` and
``torch.ops.xla.dynamic_view`` (defined by the simulator's runtime, once per process) and
their implementations."""

from __future__ import annotations

from xlasim.runtime.dynamic_reshape_ops import (
    dynamic_expand,
    dynamic_expand_meta,
    dynamic_expand_xla,
    dynamic_view,
    dynamic_view_meta,
    dynamic_view_xla,
)

__all__ = [
    "dynamic_expand",
    "dynamic_expand_meta",
    "dynamic_expand_xla",
    "dynamic_view",
    "dynamic_view_meta",
    "dynamic_view_xla",
]
