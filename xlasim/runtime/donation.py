"""Buffers user code marks for donation (``_set_buffer_donation``,
``xla::dynamo_set_buffer_donor_``), and what a program compiled to alias them does to them.

torch_xla 2.9 (measured on CPU): only a tensor holding device data can be marked (a pending
op's result cannot: False, nothing counted); each mark counts ``XlaSetBufferDonation``. The
mark belongs to the buffer, so a tensor given a new value (an in-place update) reads False.
The dynamo bridge compiles its programs to alias the marked inputs' buffers; running one
deletes them (``Data Handle: Deleted``), and reading such a tensor again fails. A sync of a
lazy graph reading a marked buffer donates it too; the simulator refuses that sync
(NotImplementedError) rather than keep data torch_xla deletes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

from xlasim.runtime import graph_inputs
from xlasim.runtime.tensor import XlaSimTensor

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
    """``xla::dynamo_set_buffer_donor_`` on a device tensor."""
    if not _replaying:
        set_donation(rt, t, should_donate)


def _device_buffer(t: XlaSimTensor) -> Any:
    return t._buf if t._node is None and not t._on_host else None


def set_donation(rt: Any, t: XlaSimTensor, should_donate: bool) -> bool:
    buf = _device_buffer(t)
    if buf is None:
        return False
    buf.donate = bool(should_donate)
    rt.metrics.inc("XlaSetBufferDonation")
    if _refuse_donating_syncs not in rt.graphs.before_execute:
        rt.graphs.before_execute.append(_refuse_donating_syncs)
    return True


def _refuse_donating_syncs(tensors: list[XlaSimTensor]) -> None:
    """A sync of a graph reading a marked buffer: torch_xla donates the buffer to it (the
    data is deleted), under rules the simulator does not reproduce."""
    if graph_inputs.donated_positions(tensors):
        raise NotImplementedError(
            "xlasim does not simulate syncing a graph that reads a buffer marked for donation "
            "(_set_buffer_donation): torch_xla gives the buffer to the program and deletes the "
            "data; only the dynamo bridge's programs (torch.compile, openxla) simulate donation"
        )


def donation(t: XlaSimTensor) -> bool:
    buf = _device_buffer(t)
    return buf is not None and buf.donate


def run_donating(inputs: Iterable[Any]) -> None:
    """After a program compiled to alias donated buffers ran on ``inputs``: those are gone."""
    for t in inputs:
        if isinstance(t, XlaSimTensor):
            buf = _device_buffer(t)
            if buf is not None and buf.donate:
                buf.deleted = True
