"""``torch_xla.experimental.stablehlo_custom_call``: XLA custom calls from PyTorch, and the
host-offloading ops built on them.

A custom call runs a kernel the backend registers under ``call_target``; the simulator has
none of those kernels, so ``stablehlo_custom_call`` on device tensors raises
``NotImplementedError`` naming the target.  ``place_to_host``/``place_to_device`` only
annotate where a value lives: the simulator computes them (see ``xlasim.runtime.placement_ops``).
An exported program's ops in ``StableHLOExportOptions.custom_ops_allowed_in_graph`` are
written as custom calls in its StableHLO (``torch_xla.stablehlo``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from xlasim.runtime.placement_ops import place_to_device, place_to_host


def stablehlo_custom_call(
    args: Sequence[torch.Tensor],
    call_target: str,
    output_shapes: Sequence[Sequence[int]],
    output_dtypes: Sequence[torch.dtype],
    has_side_effect: bool = False,
    backend_config: str | bytes = "",
    api_version: int = 0,
    frontend_attributes: dict[str, str] | None = None,
) -> Any:
    raise NotImplementedError(
        f"xlasim: the XLA custom call {call_target!r} is not simulated: its kernel is the "
        "backend's, which the simulator does not have (torch_xla._XLAC._xla_custom_call)"
    )


def extract_custom_call_outputs_shape_dtype(
    n: torch.fx.Node,
) -> tuple[Sequence[Any], Sequence[torch.dtype]]:
    """An FX node's output shapes and dtypes, from its example value (one tensor or several)."""
    assert "val" in n.meta
    value = n.meta["val"]
    values = [value] if isinstance(value, torch.Tensor) else list(value)
    assert all(isinstance(v, torch.Tensor) for v in values)
    return [v.shape for v in values], [v.dtype for v in values]


__all__ = [
    "extract_custom_call_outputs_shape_dtype",
    "place_to_device",
    "place_to_host",
    "stablehlo_custom_call",
]
