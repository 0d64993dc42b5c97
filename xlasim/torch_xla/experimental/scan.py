"""Simulated ``torch_xla.experimental.scan``: ``fn`` applied along the leading dimension of
``xs``, threading a carry, with the per-step outputs stacked.

torch_xla traces ``fn`` once (AOTAutograd) into an XLA While loop; the simulator runs ``fn``
once per slice on its CPU values instead, so the results and their gradients are the same
while the recorded graph is the unrolled loop (its compile accounting differs from a While
loop's). ``fn`` sees its arguments as fresh values each step, as it does when traced: an
in-place update of the carry never reaches the caller's ``init`` or an earlier step's output.
Not checked here: torch_xla's tracing refuses a ``fn`` that captures tensors (pass them in the
carry or ``xs``) and outputs that need no gradient next to ones that do; the simulator runs
such a ``fn`` as written.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from weakref import WeakKeyDictionary

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten


def _leading_length(xs: Any) -> int:
    leaves, _ = tree_flatten(xs)
    lengths = [len(leaf) for leaf in leaves]
    if not lengths:
        raise ValueError(f"`xs` {xs} is an empty PyTree.")
    for length in lengths[1:]:
        if length != lengths[0]:
            raise ValueError(
                "The leaves of the `xs` input PyTree must have the same leading dimension "
                f"size. Got {lengths[0]} and {length}"
            )
    return lengths[0]


def _fresh(tree: Any) -> Any:
    return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, tree)


def _stack(per_step: list[Any]) -> Any:
    """The steps' output PyTrees as one PyTree of tensors stacked along a new dim 0 (None for
    no steps)."""
    if not per_step:
        return None
    flat = [tree_flatten(y) for y in per_step]
    spec = flat[0][1]
    columns = zip(*(leaves for leaves, _ in flat), strict=True)
    stacked = [
        torch.stack(column) if isinstance(column[0], torch.Tensor) else column[0]
        for column in columns
    ]  # a None output (scan_layers' steps give one) stays None
    return tree_unflatten(stacked, spec)


def scan(
    fn: Callable[[Any, Any], tuple[Any, Any]],
    init: Any,
    xs: Any,
    partition_fn: Any = None,
    is_fn_pure: bool = False,
) -> tuple[Any, Any]:
    """(final carry, stacked outputs) of ``carry, y = fn(carry, x)`` over ``xs``'s slices.
    ``partition_fn`` and ``is_fn_pure`` tune torch_xla's tracing only; nothing is traced
    here."""
    if not callable(fn):
        raise ValueError(f"`fn` {fn} must be callable.")
    length = _leading_length(xs)
    carry = init
    outputs = []
    for i in range(length):
        carry, y = fn(_fresh(carry), _fresh(tree_map(lambda leaf, i=i: leaf[i], xs)))
        outputs.append(y)
    return carry, _stack(outputs)


def value_and_grad_partitioned(
    fn: Callable[..., Any],
    init: Any,
    xs: Any,
    partition_fn: Any = None,
    is_fn_pure: bool = True,
) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
    raise NotImplementedError(
        "xlasim does not simulate torch_xla.experimental.scan.value_and_grad_partitioned "
        "(the forward and backward graphs AOTAutograd partitions from one scan step); "
        "scan itself, and its gradient, are simulated"
    )


def tree_flatten_none(pytree: Any) -> tuple[list[Any], Callable[[list[Any]], Any]]:
    """The pytree's leaves less its ``None`` ones, and a function that rebuilds the tree from
    such a list (the ``None`` leaves put back where they were)."""
    leaves, spec = tree_flatten(pytree)
    kept = [leaf for leaf in leaves if leaf is not None]
    holes = [leaf is None for leaf in leaves]

    def unflatten(flat: list[Any]) -> Any:
        given = iter(flat)
        return tree_unflatten([None if hole else next(given) for hole in holes], spec)

    return kept, unflatten


class _ScanGraphCache(WeakKeyDictionary):
    """torch_xla keeps the forward and backward graphs it traced for a pure ``fn`` here
    (``fn`` -> shapes -> graphs). The simulator runs ``fn`` step by step and traces no such
    graphs, so the cache can be cleared but what it holds cannot be asked."""

    def _unsimulated(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            "xlasim does not simulate torch_xla.experimental.scan._SCAN_COMPUTATION_CACHE "
            "(the forward and backward graphs torch_xla traces once per pure scan fn): the "
            "simulator runs the fn at every step and keeps no traced graphs"
        )

    __contains__ = __getitem__ = __len__ = __iter__ = _unsimulated
    get = keys = items = values = _unsimulated


_SCAN_COMPUTATION_CACHE = _ScanGraphCache()
