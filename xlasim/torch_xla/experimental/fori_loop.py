"""``torch_xla.experimental.fori_loop``: importing it makes ``torch._higher_order_ops``'s
``while_loop`` run on XLA tensors (``xlasim.runtime.while_loops`` simulates the loop);
``fori_loop`` counts ``upper - lower`` steps of ``body_fun``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._higher_order_ops.while_loop import while_loop_op

from xlasim.runtime.tensor import XlaSimTensor
from xlasim.runtime.while_loops import counter_first, form_not_lowered, run_while_loop


def fori_loop(
    lower: torch.Tensor, upper: torch.Tensor, body_fun: Callable[..., Any], *input_value: Any
) -> list[Any]:
    """``body_fun`` applied ``upper - lower`` times; the spent counter first, then the values."""
    if upper < lower:
        print("ERROR: upper should be a larger number than lower")  # torch_xla's message
    steps = upper - lower
    if not counter_first((steps, *input_value)):
        raise form_not_lowered()
    return run_while_loop(
        lambda count, *values: count > 0,
        lambda count, *values: (count - 1, body_fun(*values)),
        (steps, *input_value),
        (),
    )


def while_loop(
    cond_fn: Callable[..., Any],
    body_fn: Callable[..., Any],
    carried_inputs: Sequence[Any],
    additional_inputs: Sequence[Any] | None = None,
) -> list[Any]:
    if not counter_first(carried_inputs):
        raise form_not_lowered()
    return run_while_loop(cond_fn, body_fn, carried_inputs, additional_inputs or ())


# Each simulation imports this module afresh; the rule it registers replaces an earlier one's.
while_loop_op.python_key_table.pop(XlaSimTensor, None)
while_loop_op.py_impl(XlaSimTensor)(while_loop)
