"""Device buffers user code marked for donation (``torch_xla._XLAC._set_buffer_donation``).

Measured on torch_xla 2.9 (CPU), and documented in its ``_set_buffer_donation`` binding:

- The mark belongs to device data: a tensor holding data (or a ``device_data`` IR value) takes
  it and the call returns True (counter ``XlaSetBufferDonation``); a pending op's result
  returns False. A tensor updated in place holds a pending op, so it reads False until its new
  data exists, which is not marked.
- A graph donates the marked buffers it reads at a step barrier (``torch_xla.sync()``, or
  ``_xla_sync_multi`` with ``sync_xla_data``), or at any execution while
  ``_xla_set_enable_alias_with_buffer_donor_config(True)``. Together with the buffers of
  tensors updated in place (counted once when both), they make ``InputOutputAliasCount``;
  the donors' positions are part of the graph's hash.
- A donated buffer is deleted: its tensor is a placeholder (``_is_placecholder``) and a graph
  that reads it fails. A rank-0 buffer is counted but stays readable.

The simulator identifies device data by the key object its tensors hand graphs as input
(``tensor.leaf_input``): the same object for the same data, a new one for new data.
"""

from __future__ import annotations

import weakref
from typing import Any


class BufferDonors:
    """The donation marks and deleted buffers of one runtime's device data."""

    __slots__ = ("marked", "deleted", "user_config")

    def __init__(self) -> None:
        # id(data key) -> (data key, the tensor that held it when marked, its device's name)
        self.marked: dict[int, tuple[Any, weakref.ReferenceType[Any], str]] = {}
        # id(data key) -> (data key, device name)
        self.deleted: dict[int, tuple[Any, str]] = {}
        # ``_xla_set_enable_alias_with_buffer_donor_config``; process-wide in torch_xla.
        self.user_config = False

    def mark(self, key: Any, tensor: Any, device: str, donate: bool) -> None:
        if donate:
            self.marked[id(key)] = (key, weakref.ref(tensor), device)
        else:
            self.marked.pop(id(key), None)

    def is_marked(self, key: Any) -> bool:
        """Whether buffer ``key`` is marked (a donated one keeps its mark)."""
        entry = self.marked.get(id(key))
        return entry is not None and entry[0] is key

    def deleted_on(self, key: Any) -> str | None:
        """The device of deleted buffer ``key``; None while the buffer exists."""
        entry = self.deleted.get(id(key))
        return entry[1] if entry is not None and entry[0] is key else None

    def donors(self, inputs: list[Any]) -> list[int]:
        """Positions of the marked buffers among a graph's distinct device-data inputs."""
        return [i for i, key in enumerate(inputs) if self.is_marked(key)]

    def donate(self, inputs: list[Any], positions: list[int]) -> None:
        """The executed graph consumed the buffers at ``positions``: they are deleted (a
        rank-0 one stays, as measured)."""
        for i in positions:
            key = inputs[i]
            _, ref, device = self.marked[id(key)]
            if len(key[0]) == 0:
                continue
            self.deleted[id(key)] = (key, device)
            holder = ref()
            if holder is not None and holder._node is None:
                holder._buf = None  # its HBM is the output's now

    def replaced(self, key: Any) -> None:
        """A tensor got new data: the mark of the data it held is gone with it."""
        entry = self.marked.get(id(key))
        if entry is not None and entry[0] is key:
            del self.marked[id(key)]
