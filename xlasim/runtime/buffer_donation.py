"""How user code and the dynamo bridge mark device buffers for donation, and what a program
compiled to alias them does to them, over the runtime's marks (``runtime.donation``).

torch_xla 2.9 (measured on CPU): ``_set_buffer_donation`` and ``xla::dynamo_set_buffer_donor_``
mark a tensor's device data (a pending op's result cannot be marked: False); the dynamo
bridge compiles its programs to alias the marked inputs' buffers, and running one deletes them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

from xlasim.runtime.tensor import XlaSimTensor, leaf_input


def set_donation(rt: Any, t: XlaSimTensor, should_donate: bool) -> bool:
    """``_set_buffer_donation``: marks ``t``'s device data; False, changing nothing, for a
    pending op's result."""
    if t._node is not None:
        return False
    device = rt.real_devices()[t._device.index or 0]
    rt.graphs.donors.mark(leaf_input(t), t, device, bool(should_donate))
    rt.metrics.inc("XlaSetBufferDonation")
    return True


_replaying = False


@contextlib.contextmanager
def compiled_program_running() -> Iterator[None]:
    """While the dynamo bridge runs a compiled program by replaying its graph: the donation
    marks in the graph were taken when it was traced, and running the program marks
    nothing (torch_xla does not run the graph's Python ops again)."""
    global _replaying
    before, _replaying = _replaying, True
    try:
        yield
    finally:
        _replaying = before


def mark_from_graph(rt: Any, t: Any, should_donate: bool) -> None:
    """``xla::dynamo_set_buffer_donor_`` on a device tensor (its kernel's argument)."""
    if not _replaying and isinstance(t, XlaSimTensor):
        set_donation(rt, t, should_donate)


def run_donating(rt: Any, inputs: Iterable[Any]) -> None:
    """After a program the dynamo bridge compiled to alias the marked buffers ran on
    ``inputs``: those buffers are gone."""
    keys = [leaf_input(t) for t in inputs if isinstance(t, XlaSimTensor) and t._node is None]
    rt.graphs.donors.donate(keys, rt.graphs.donors.donors(keys))
