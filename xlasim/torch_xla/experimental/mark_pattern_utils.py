"""``torch_xla.experimental.mark_pattern_utils``: ``StableHLOCompositeBuilder``, which marks a
block of a model as one ``stablehlo.composite`` of torch_xla's StableHLO export."""

from __future__ import annotations

import uuid
from typing import Any

import torch
import torch._dynamo as torchdynamo
from torch_xla.experimental import xla_marker


@torchdynamo.assume_constant_result
def _new_id() -> str:
    return uuid.uuid4().hex


class StableHLOCompositeBuilder:
    """Marks the inputs (``mark_inputs``) and outputs (``mark_outputs``) of one composite
    ``name`` with attributes ``attr``; each is called once, and the marked tensors it returns
    replace the given ones in what follows."""

    def __init__(self, name: str, attr: dict[str, Any] | None = None) -> None:
        self.attr = attr
        self.name = name
        self.id = _new_id()
        self._inputs: list[torch.Tensor] = []
        self._outputs: list[torch.Tensor] = []

    def _mark(self, tensors: tuple[Any, ...], is_input: bool) -> Any:
        # The attributes travel with the outputs' marks.
        attr = None if is_input else xla_marker.serialize_composite_attr(self.attr)
        marked = []
        for pos, tensor in enumerate(tensors):
            if not isinstance(tensor, torch.Tensor):
                raise ValueError(f"input must be a torch tensor. Got {type(tensor)}.")
            marked.append(
                torch.ops.xla.mark_tensor(
                    tensor, name=self.name, pos=pos, id=self.id, is_input=is_input, attr=attr
                )
            )
        return marked[0] if len(marked) == 1 else tuple(marked)

    def mark_inputs(self, *tensors: torch.Tensor) -> Any:
        return self._mark(tensors, is_input=True)

    def mark_outputs(self, *tensors: torch.Tensor) -> Any:
        return self._mark(tensors, is_input=False)


__all__ = ["StableHLOCompositeBuilder"]
