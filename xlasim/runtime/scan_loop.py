"""What torch_xla's ``xla::scan`` IR node holds, kept for the HLO text of scan's results.

The simulator runs scan's step graph once per step, so a result's IR is the last step's ops
(or the stack of every step's outputs). torch_xla instead makes one ``xla::scan`` node whose
outputs are the loop's final state: (iteration, carry..., xs..., ys...). A :class:`ScanLoop`
records that node's inputs and the first step's graph (the step's computation, with its
inputs standing for the computation's parameters), and the results' nodes point at it
(``Node.loop``), so ``_get_xla_tensors_hlo`` can write the ``while`` torch_xla lowers it to.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from xlasim.runtime.errors import xla_type
from xlasim.runtime.tensor import XlaSimTensor, leaf_input


def _item(t: XlaSimTensor) -> Any:
    """``t``'s IR value as an op that consumes it records it."""
    return t._node if t._node is not None else leaf_input(t)


def _type(t: XlaSimTensor) -> tuple[tuple[int, ...], str]:
    return tuple(t.shape), xla_type(t.dtype)


class ScanLoop:
    """One scan call's loop: ``init`` and ``xs`` (IR values and types) are the node's
    operands after the iteration counter, ``step_inputs`` the first step's inputs (the carry,
    then each x slice), ``step_outputs`` its outputs (the new carry, then each y), whose
    stacked values are the ``ys`` outputs, ``length`` the number of steps."""

    __slots__ = ("init", "xs", "step_inputs", "step_outputs", "length")

    def __init__(
        self,
        init: Sequence[XlaSimTensor],
        xs: Sequence[XlaSimTensor],
        step_inputs: Sequence[XlaSimTensor],
        step_outputs: Sequence[XlaSimTensor],
        length: int,
    ) -> None:
        self.init = [(_item(t), _type(t)) for t in init]
        self.xs = [(_item(t), _type(t)) for t in xs]
        self.step_inputs = [(_item(t), _type(t)) for t in step_inputs]
        self.step_outputs = [(_item(t), _type(t)) for t in step_outputs]
        self.length = length


def tag_outputs(loop: ScanLoop, carry: Sequence[XlaSimTensor], ys: Sequence[XlaSimTensor]) -> None:
    """Marks the final carry and the stacked ys as the loop's outputs, unless one of them is
    not a value the loop made (then the HLO text stays that of the unrolled steps)."""
    n_xs = len(loop.xs)
    outputs = [(t, 1 + i) for i, t in enumerate(carry)]
    outputs += [(t, 1 + len(carry) + n_xs + i) for i, t in enumerate(ys)]
    nodes = [t._node for t, _ in outputs]
    fresh = [n for n in nodes if n is not None and n.loop is None]
    if len(fresh) < len(nodes) or len({id(n) for n in fresh}) < len(fresh):
        return
    for node, (_, index) in zip(fresh, outputs, strict=True):
        node.loop = (loop, index)
