"""``torch_xla.experimental.xla_marker``: ``torch.ops.xla.mark_tensor``, which marks the inputs
and outputs of a pattern instance so that torch_xla's StableHLO export writes the instance as
a ``stablehlo.composite`` named for the pattern, with the pattern's attributes.

The op is defined by the simulator's runtime (``xlasim.runtime.marker_ops``); the composites
come from ``torch_xla.stablehlo``'s export of a ``torch.export`` program.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

import torch
import torch._dynamo as torchdynamo

from xlasim.runtime.marker_ops import mark_tensor, mark_tensor_meta


@dataclass
class BoundaryMetadata:
    name: str
    pos: int
    id: str
    is_input: bool = True
    # The pattern's attributes, carried by its outputs' marks.
    attr: dict | None = None


class BoundaryMetadataSerializer(json.JSONEncoder):
    def default(self, obj: Any) -> Any:
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            return dataclasses.asdict(obj)
        return super().default(obj)


_ATTR_VALUE_ERROR = (
    "Composite attr value must be either Python str, float, int, bool, list[int], "
    "list[float], list[bool]."
)


def _check_attr(attr: Any) -> None:
    if attr is None:
        return
    if not isinstance(attr, dict):
        raise ValueError("Composite attr must be a Python dictionary.")
    for key, value in attr.items():
        if not isinstance(key, str):
            raise ValueError("Composite attr name must be a Python str.")
        if isinstance(value, (list, tuple)):
            kinds = {type(v) for v in value}
            if len(kinds) != 1 or not kinds <= {int, float, bool}:
                raise ValueError(_ATTR_VALUE_ERROR)
        elif type(value) not in (str, float, int, bool):
            raise ValueError(_ATTR_VALUE_ERROR)


@torchdynamo.assume_constant_result
def serialize_composite_attr(attr: dict | None) -> tuple[tuple[str, Any], ...] | None:
    """``attr`` as ``mark_tensor`` takes it (a tuple of its items), checked."""
    if attr is None:
        return None
    _check_attr(attr)
    return tuple(attr.items())


@torchdynamo.assume_constant_result
def deserialize_composite_attr(attr: Any) -> dict | None:
    return None if attr is None else dict(attr)


def mark_tensor_xla(
    x: torch.Tensor,
    name: str,
    pos: int,
    id: str,  # noqa: A002 - the schema's name
    is_input: bool,
    attr: Any = None,
) -> torch.Tensor:
    """``mark_tensor`` on an XLA tensor: the simulated device computes the mark (a copy); the
    boundary is kept by the exported graph's ``mark_tensor`` nodes."""
    _check_attr(deserialize_composite_attr(attr))
    return mark_tensor(x, name, pos, id, is_input, attr)


__all__ = [
    "BoundaryMetadata",
    "BoundaryMetadataSerializer",
    "deserialize_composite_attr",
    "mark_tensor",
    "mark_tensor_meta",
    "mark_tensor_xla",
    "serialize_composite_attr",
]
