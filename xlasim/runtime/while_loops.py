"""torch_xla's ``while_loop`` (the ``torch._higher_order_ops.while_loop`` op on XLA tensors).

torch_xla 2.9 lowers the loop to one XLA ``While`` whose first carried value is the loop
counter: an integer scalar, followed by at least one other carried value (other forms fail
its shape check). The simulator runs the loop on its lazy tensors, reading the condition
after each step, so the values are the loop's while the recorded graphs are the unrolled
steps (one execution per condition read, where torch_xla runs one ``While`` program).

torch_xla's lowering turns what the body captures beyond the carried values and the tensors
dynamo lifts (a Python scalar other than 0 and 1, a device tensor it does not lift) into
extra parameters that then fail its shape check, and folds a carried vector made on the
device by a factory into the body as a constant; the simulator runs such bodies as written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch


def counter_first(carried: Sequence[Any]) -> bool:
    """Whether ``carried`` has the form torch_xla lowers: an integer scalar counter first,
    then at least one other value."""
    first = carried[0] if carried else None
    return (
        len(carried) >= 2
        and isinstance(first, torch.Tensor)
        and first.dim() == 0
        and not (first.dtype.is_floating_point or first.dtype.is_complex)
        and first.dtype != torch.bool
    )


def form_not_lowered() -> NotImplementedError:
    return NotImplementedError(
        "xlasim simulates torch_xla's while_loop in the form torch_xla 2.9 lowers: an "
        "integer scalar counter first among at least two carried values"
    )


def run_while_loop(
    cond_fn: Callable[..., Any],
    body_fn: Callable[..., Any],
    carried: Sequence[Any],
    additional: Sequence[Any],
) -> list[Any]:
    """The carried values once ``cond_fn`` turns false (``carried`` is counter-first)."""
    values = tuple(carried)
    while bool(cond_fn(*values, *additional)):
        values = tuple(body_fn(*values, *additional))
    return list(values)
