"""The key a graph records for a device-data input, and the data it holds once asked to.

torch_xla's IR node for device data holds the data itself, so a graph can list (and run on)
data whose tensor has since been freed or written over in place. The simulator's ops compute
on each tensor's CPU values in place, and keeping a copy of every overwritten value would
slow every optimizer step; so keys hold their data only once the process has asked about a
graph's device data (``keep_data``): from then on each new key refers to its tensor's values,
and an op about to write into a device-data tensor first gives its key a copy.
"""

from __future__ import annotations

from typing import Any

import torch


class DataKey(tuple):
    """(shape, dtype, sharding text) of one device-data input, as graphs record it (compared
    by identity: one per buffer and sharding); ``data``/``device``: the values it stands for
    and where, once kept; ``number``: the tensor id ``_xla_get_tensor_id`` gave that data."""

    data: torch.Tensor | None = None
    device: torch.device | None = None
    number: int | None = None


_keeping = False


def keep_data() -> None:
    """From now on, keys hold their data (the process asked about a graph's device data)."""
    global _keeping
    _keeping = True


def keeping() -> bool:
    return _keeping


def new_key(shape: tuple[int, ...], dtype: torch.dtype, sharding: str, t: Any) -> DataKey:
    """The key for device-data tensor ``t`` (its values ``t._elem`` on ``t._device``)."""
    key = DataKey((shape, dtype, sharding))
    if _keeping:
        key.data, key.device = t._elem, t._device
    return key


def before_write(key: DataKey, t: Any) -> None:
    """An op is about to write ``t``'s values in place; the key keeps the values it stood
    for (a copy, as the tensor's own values change)."""
    if key.data is None or key.data is t._elem:
        key.data, key.device = t._elem.clone(), t._device
