"""Simulated ``torch_xla.experimental.scan``: ``fn`` applied along the leading dimension of
``xs``, threading a carry, with the per-step outputs stacked.

As in torch_xla, ``fn`` is traced once with AOTAutograd (on placeholder tensors of one step's
shapes) into a forward graph and a backward graph, split by ``partition_fn``; scan runs the
forward graph over the steps and, on ``backward()``, the backward graph over them in reverse,
from the activations the forward graph saved. What AOTAutograd refuses to trace (a ``fn``
that mutates a tensor it captured) fails here as there. torch_xla lowers the step graph into
one XLA While loop; the simulator runs the graph once per step on its lazy tensors, so values
and gradients are torch_xla's while the recorded graph is the unrolled loop: its IR text has
each step's ops (the steps' slices of ``xs`` as selects, the outputs stacked) where torch_xla's
has one ``xla::scan`` node, and its compile accounting differs. The forward loop's results
also point at a record of that node (``xlasim.runtime.scan_loop``), so their HLO text is
torch_xla's ``while`` calling the step's computation; the gradients' is the backward steps
unrolled (torch_xla writes a second loop).

The traced graphs of a ``fn`` declared pure are kept in ``_SCAN_COMPUTATION_CACHE``
(``fn`` -> (partition_fn id, shapes, dtypes, tree specs) -> (forward, alias_input,
backward)), so scanning it again with inputs of the same structure does not call ``fn``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any
from weakref import WeakKeyDictionary

import torch
import torch.fx
from torch._functorch._aot_autograd.utils import make_boxed_func
from torch._functorch.aot_autograd import aot_function
from torch._functorch.partitioners import default_partition
from torch.utils._pytree import tree_flatten, tree_iter, tree_map, tree_unflatten

from xlasim.runtime.scan_loop import ScanLoop, tag_outputs
from xlasim.runtime.tensor import XlaSimTensor
from xlasim.torch_xla import runtime as xr

# fn (weakly) -> {input key: (forward, alias_input, backward)}, filled for pure fns only.
_SCAN_COMPUTATION_CACHE: WeakKeyDictionary[Any, dict[Any, Any]] = WeakKeyDictionary()


def tree_flatten_none(pytree: Any) -> tuple[list[Any], Callable[[Sequence[Any]], Any]]:
    """The pytree's leaves less its ``None`` ones, and a function that rebuilds the tree from
    such a list (the ``None`` leaves put back where they were)."""
    leaves, spec = tree_flatten(pytree)
    kept = [leaf for leaf in leaves if leaf is not None]
    holes = [leaf is None for leaf in leaves]

    def unflatten(flat: Sequence[Any]) -> Any:
        given = iter(flat)
        return tree_unflatten([None if hole else next(given) for hole in holes], spec)

    return kept, unflatten


def _leading_length(xs: Any) -> int:
    length = None
    for leaf in tree_iter(xs):
        if length is None:
            length = len(leaf)
        elif len(leaf) != length:
            # torch_xla's text, with the indentation its line continuation carries.
            raise ValueError(
                "The leaves of the `xs` input PyTree must have the same leading dimension "
                f"size. {' ' * 23}Got {length} and {len(leaf)}"
            )
    if length is None:
        raise ValueError(f"`xs` {xs} is an empty PyTree.")
    return length


def scan(
    fn: Callable[[Any, Any], tuple[Any, Any]],
    init: Any,
    xs: Any,
    partition_fn: Any = default_partition,
    is_fn_pure: bool = False,
) -> tuple[Any, Any]:
    """(final carry, stacked outputs) of ``carry, y = fn(carry, x)`` over ``xs``'s slices."""
    if not callable(fn):
        raise ValueError(f"`fn` {fn} must be callable.")
    _leading_length(xs)
    steps = value_and_grad_partitioned(fn, init, xs, partition_fn, is_fn_pure)
    flat_init, unflatten_init = tree_flatten_none(init)
    flat_xs, unflatten_xs = tree_flatten_none(xs)
    run = _ScanRun(steps, unflatten_init, unflatten_xs, len(flat_init))
    flat_out = _ScanFunction.apply(run, *flat_init, *flat_xs)
    return run.unflatten_carry(flat_out[: run.n_carry]), run.unflatten_ys(flat_out[run.n_carry :])


def value_and_grad_partitioned(
    fn: Callable[[Any, Any], tuple[Any, Any]],
    init: Any,
    xs: Any,
    partition_fn: Any = default_partition,
    is_fn_pure: bool = True,
) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
    """``fn``'s traced step as three functions (torch_xla's contract):
    ``forward(carry, x) -> (new_carry, (y, partial_activations))``,
    ``alias_input(stacked partial_activations, xs) -> activations`` (puts back the saved
    activations that are inputs of ``x``, which ``forward`` leaves out so they are not
    copied through the loop) and
    ``backward(grad_new_carry, (grad_y, activations)) -> (grad_carry, grad_x)``."""
    # The carry always gets a gradient, so that one flows from each step to the one before.
    carry_like = tree_map(lambda t: torch.empty_like(t, requires_grad=True), init)
    x_like = tree_map(lambda t: torch.empty_like(t[0], requires_grad=t.requires_grad), xs)
    key = _input_key(partition_fn, carry_like, x_like)
    if is_fn_pure and key in _SCAN_COMPUTATION_CACHE.get(fn, {}):
        return _SCAN_COMPUTATION_CACHE[fn][key]
    traced = _TracedStep(fn, partition_fn, carry_like, x_like)
    steps = (traced.forward, traced.alias_input, traced.backward)
    if is_fn_pure:
        _SCAN_COMPUTATION_CACHE.setdefault(fn, {})[key] = steps
    return steps


def _input_key(partition_fn: Any, carry: Any, x: Any) -> tuple[Any, ...]:
    def described(tree: Any) -> tuple[Any, Any]:
        leaves, spec = tree_flatten(tree)
        return tuple((tuple(t.shape), t.dtype) for t in leaves), spec

    (carry_shapes, carry_spec), (x_shapes, x_spec) = described(carry), described(x)
    return (id(partition_fn), carry_shapes, x_shapes, carry_spec, x_spec)


class _TracedStep:
    """The forward and backward graphs AOTAutograd makes of one call of ``fn``."""

    def __init__(self, fn: Callable[..., Any], partition_fn: Any, carry: Any, x: Any) -> None:
        graphs: dict[str, torch.fx.GraphModule] = {}

        def keeper(name: str) -> Callable[..., Any]:
            def compile_graph(gm: torch.fx.GraphModule, _example_inputs: Any) -> Any:
                graphs[name] = gm
                return make_boxed_func(gm)

            return compile_graph

        def step_without_aliases(*args: Any) -> Any:
            # AOTAutograd hands an output that is an input back outside its graphs; cloned,
            # it is an output of the forward graph and gets a gradient in the backward one.
            inputs = {id(t) for t in tree_iter(args)}
            return tree_map(lambda t: t.clone() if id(t) in inputs else t, fn(*args))

        with torch.enable_grad():
            compiled = aot_function(
                step_without_aliases,
                fw_compiler=keeper("forward"),
                bw_compiler=keeper("backward"),
                partition_fn=partition_fn,
            )
            out = compiled(carry, x)
            self.num_out = len(list(tree_iter(out)))
            flat_out, self.unflatten_out = tree_flatten_none(out)
            torch.autograd.backward(flat_out, [torch.ones_like(t) for t in flat_out])
        self.forward_graph = graphs["forward"]
        self.backward_graph = graphs["backward"]
        _, self.unflatten_grads = tree_flatten_none((carry, x))
        self.n_carry = len(tree_flatten(carry)[0])
        self.aliased = self._activations_that_are_x(len(tree_flatten(x)[0]))

    def _activations_that_are_x(self, n_x: int) -> dict[int, int]:
        """{index of an ``x`` leaf: index among the activations} for the activations the
        forward graph returns unchanged from its ``x`` inputs."""
        placeholders = [n for n in self.forward_graph.graph.nodes if n.op == "placeholder"]
        x_inputs = {node: i for i, node in enumerate(placeholders[self.n_carry :])}
        output = next(n for n in self.forward_graph.graph.nodes if n.op == "output")
        returned = output.args[0]
        found: dict[int, int] = {}
        for index, node in enumerate(returned[self.num_out :]):
            if node in x_inputs and x_inputs[node] not in found:
                found[x_inputs[node]] = index
        assert all(i < n_x for i in found)
        return found

    def _run_forward(self, carry: Any, x: Any) -> tuple[Any, Any, list[Any]]:
        out = self.forward_graph(*tree_flatten(carry)[0], *tree_flatten(x)[0])
        new_carry, y = self.unflatten_out(out[: self.num_out])
        return new_carry, y, list(out[self.num_out :])

    def forward(self, carry: Any, x: Any) -> tuple[Any, Any]:
        new_carry, y, activations = self._run_forward(carry, x)
        kept = set(self.aliased.values())
        partial = tuple(a for i, a in enumerate(activations) if i not in kept)
        return new_carry, (y, partial)

    def alias_input(self, partial_activations: Sequence[Any], xs: Any) -> tuple[Any, ...]:
        activations = list(partial_activations)
        x_leaves = list(tree_iter(xs))
        for x_index, activation_index in sorted(self.aliased.items(), key=lambda kv: kv[1]):
            activations.insert(activation_index, x_leaves[x_index])
        return tuple(activations)

    def backward(self, grad_carry: Any, grad_y_and_activations: Any) -> tuple[Any, Any]:
        grad_y, activations = grad_y_and_activations
        out = self.backward_graph(
            *activations, *tree_flatten(grad_carry)[0], *tree_flatten_none(grad_y)[0]
        )
        return self.unflatten_grads(out)


def _leaves_and_nones(tree: Any) -> list[Any]:
    """The tree's leaves, a ``None`` (no gradient for that input) counted as one."""
    return tree_flatten(tree, is_leaf=lambda v: v is None)[0]


def _stack(columns: Sequence[Sequence[Any]]) -> list[Any]:
    """Each column of per-step tensors stacked along a new dim 0 (``None`` stays ``None``)."""
    return [None if col[0] is None else torch.stack(list(col)) for col in columns]


class _ScanRun:
    """What one scan call's autograd function needs: the traced step and the trees' shapes."""

    def __init__(
        self,
        steps: tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]],
        unflatten_init: Callable[[Sequence[Any]], Any],
        unflatten_xs: Callable[[Sequence[Any]], Any],
        n_carry: int,
    ) -> None:
        self.forward, self.alias_input, self.backward = steps
        self.unflatten_init, self.unflatten_xs = unflatten_init, unflatten_xs
        self.n_carry = n_carry
        self.length = 0
        self.unflatten_carry: Callable[[Sequence[Any]], Any] = unflatten_init
        self.unflatten_ys: Callable[[Sequence[Any]], Any] = lambda _: None

    def run_forward(self, flat_init: Sequence[Any], flat_xs: Sequence[Any]) -> tuple[Any, ...]:
        """(flat final carry, flat stacked ys, activations) of the forward graph's loop."""
        self.length = length = len(flat_xs[0])
        carry = self.unflatten_init(flat_init)
        ys: list[list[Any]] = []
        partials: list[Sequence[Any]] = []
        first_step: list[Any] = []
        for i in range(length):
            x = [t[i] for t in flat_xs]
            carry, (y, partial) = self.forward(carry, self.unflatten_xs(x))
            flat_y, self.unflatten_ys = tree_flatten_none(y)
            ys.append(flat_y)
            partials.append(partial)
            if i == 0:
                first_step = [*x, *tree_flatten_none(carry)[0], *flat_y, *partial]
        flat_carry, self.unflatten_carry = tree_flatten_none(carry)
        stacked_ys = _stack(list(zip(*ys, strict=True))) if ys and ys[0] else []
        stacked_partial = (
            _stack(list(zip(*partials, strict=True))) if partials and partials[0] else []
        )
        loop_ys = [*stacked_ys, *stacked_partial]
        every = [*flat_init, *flat_xs, *first_step, *flat_carry, *loop_ys]
        if length and all(type(t) is XlaSimTensor for t in every):
            n_x = len(flat_xs)
            loop = ScanLoop(
                flat_init,
                flat_xs,
                [*flat_init, *first_step[:n_x]],
                first_step[n_x:],
                length,
            )
            tag_outputs(loop, flat_carry, loop_ys)
        activations = self.alias_input(stacked_partial, self.unflatten_xs(list(flat_xs)))
        return tuple(flat_carry), tuple(stacked_ys), tuple(activations)

    def run_backward(
        self, grad_carry: Sequence[Any], grad_ys: Sequence[Any], activations: Sequence[Any]
    ) -> tuple[list[Any], list[Any]]:
        """(flat gradient of init, flat gradient of xs), the backward graph run last step
        first."""
        carry_grad = self.unflatten_carry(list(grad_carry))
        per_step: list[list[Any]] = []
        for i in reversed(range(self.length)):
            grad_y = self.unflatten_ys([g[i] for g in grad_ys])
            carry_grad, x_grad = self.backward(carry_grad, (grad_y, [a[i] for a in activations]))
            per_step.append(_leaves_and_nones(x_grad))
        per_step.reverse()
        flat_carry_grad = _leaves_and_nones(carry_grad)
        return flat_carry_grad, _stack(list(zip(*per_step, strict=True)))


class _ScanFunction(torch.autograd.Function):
    """scan's autograd node: the forward loop's activations saved for the backward loop."""

    @staticmethod
    def forward(ctx: Any, run: _ScanRun, *flat_inputs: Any) -> tuple[Any, ...]:
        flat_init, flat_xs = flat_inputs[: run.n_carry], flat_inputs[run.n_carry :]
        carry, ys, activations = run.run_forward(flat_init, flat_xs)
        ctx.run = run
        ctx.n_ys = len(ys)
        # The inputs themselves are saved (not copies): an activation that is an x leaf
        # costs no memory beyond xs.
        ctx.save_for_backward(*flat_inputs, *activations)
        return (*carry, *ys)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> tuple[Any, ...]:
        run: _ScanRun = ctx.run
        if xr.is_spmd():
            raise NotImplementedError(
                "xlasim does not simulate scan's backward under SPMD (torch_xla gives each "
                "gradient the sharding of its input with shard_as)"
            )
        saved = ctx.saved_tensors
        activations = saved[len(ctx.needs_input_grad) - 1 :]
        grad_carry, grad_ys = grads[: run.n_carry], grads[run.n_carry :]
        with torch.no_grad():
            grad_init, grad_xs = run.run_backward(grad_carry, grad_ys, activations)
        return (None, *grad_init, *grad_xs)
