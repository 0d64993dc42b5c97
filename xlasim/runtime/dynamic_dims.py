"""Bounded dynamic dimensions: torch_xla's ``XLA_EXPERIMENTAL`` ops with data-dependent shapes.

With ``nonzero`` or ``masked_select`` named in ``XLA_EXPERIMENTAL`` (colon-separated),
torch_xla 2.9 lowers those ops instead of running them on its CPU fallback; the result's
first dimension is dynamic: XLA knows only its upper bound (the input's element count) until
the graph runs. torch_xla hands the dimension to PyTorch as a ``SymInt`` whose text is the
bound (``<=10``) and whose ``int()`` is the real size; arithmetic on it (``+ - % min max``,
comparisons) makes new size nodes, each counted ``xla::size_<op>``, whose bound is the op
applied to the operands' bounds and whose value the op applied to their values. Measured on
torch_xla 2.9 (CPU): ``nonzero``'s index type is s32; making the tensor compiles and runs the
graph of its size once (torch reads the sizes when it sets them on the tensor).

Here each dimension is a :class:`SizeNode` (PyTorch's Python ``SymNode`` protocol), holding
the bound and the value, which the simulator knows as soon as the op has computed.
"""

from __future__ import annotations

import builtins
import math
import operator
import os
from collections.abc import Callable
from typing import Any

import torch
from torch._dispatch.python import no_python_dispatcher

# The aten ops whose lowering has a dynamic dimension, and the experiment that turns it on.
EXPERIMENTS = {"aten::nonzero": "nonzero", "aten::masked_select": "masked_select"}

_COMPARISON_TEXT = "Comparison operators should be using getDynamicValue"

aten = torch.ops.aten

# Set once any tensor with a dynamic dimension exists: until then the dispatcher never looks
# for one (the check costs a shape query per argument).
SEEN = False

# The ops whose torch_xla kernel refuses two operands that both have a dynamic dimension.
_ONE_DYNAMIC_OPERAND = {aten.add.Tensor: "add", aten.sub.Tensor: "sub"}
_VIEWS = frozenset({aten.view.default, aten._unsafe_view.default})


def experiment_on(qualified_op: str) -> bool:
    """Whether ``XLA_EXPERIMENTAL`` turns on the dynamic-shape lowering of the op (named
    ``aten::nonzero``)."""
    experiment = EXPERIMENTS.get(qualified_op)
    return experiment is not None and experiment in os.environ.get("XLA_EXPERIMENTAL", "").split(
        ":"
    )


def lowered_dynamic(op: Any) -> bool:
    """Whether ``op`` (an overload) gives a result with a dynamic dimension."""
    schema = getattr(op, "_schema", None)
    return (
        schema is not None
        and getattr(op, "_overloadname", None) == "default"
        and experiment_on(schema.name)
    )


class SizeNode:
    """One integer size: ``bound`` (XLA's static upper bound) and ``value`` (the real size).
    A constant (a plain int brought into size arithmetic) has both the same. ``metrics`` is
    the runtime's store, where each size op is counted."""

    __slots__ = ("bound", "value", "constant", "metrics")

    def __init__(self, bound: int, value: int, metrics: Any, constant: bool = False) -> None:
        self.bound = bound
        self.value = value
        self.metrics = metrics
        self.constant = constant

    def _count(self, name: str) -> None:
        self.metrics.inc(f"xla::size_{name}")

    # What it is, for PyTorch's wrapping of a node into SymInt/SymBool.
    def is_int(self) -> bool:
        return True

    def is_float(self) -> bool:
        return False

    def is_bool(self) -> bool:
        return False

    def is_nested_int(self) -> bool:
        return False

    def is_symbolic(self) -> bool:
        return True

    def is_constant(self) -> bool:
        return False  # even a constant node stays a size node once made (as torch_xla's)

    def has_hint(self) -> bool:
        return True

    def maybe_as_int(self) -> int | None:
        return None

    def constant_int(self) -> int | None:
        return None

    def nested_int(self) -> int | None:
        return None

    def wrap_int(self, num: int) -> SizeNode:
        return SizeNode(num, num, self.metrics, constant=True)

    def wrap_bool(self, flag: bool) -> SizeBool:
        return SizeBool(flag)

    def wrap_float(self, num: float) -> Any:
        raise NotImplementedError("xlasim does not simulate float arithmetic on dynamic sizes")

    # Reading it: the text is the bound, the integer the real size.
    def str(self) -> str:
        return str(self.bound) if self.constant else f"<={self.bound}"

    def _graph_repr(self) -> builtins.str:
        return self.str()

    def __str__(self) -> builtins.str:
        return self.str()

    def int_(self) -> int:
        return self.value

    def guard_int(self, file: Any = None, line: Any = None) -> int:
        return self.value

    def guard_size_oblivious(self, file: Any = None, line: Any = None) -> int:
        return self.value

    def expect_size(self, file: Any = None, line: Any = None) -> bool:
        return self.value >= 0

    def clone(self) -> SizeNode:
        self._count("clone")
        return SizeNode(self.bound, self.value, self.metrics, self.constant)

    # Arithmetic: a new node; the op applies to the bounds and to the values.
    def _binary(
        self, name: builtins.str, other: SizeNode, fn: Callable[[int, int], int]
    ) -> SizeNode:
        self._count(name)
        return SizeNode(fn(self.bound, other.bound), fn(self.value, other.value), self.metrics)

    def add(self, other: SizeNode) -> SizeNode:
        return self._binary("add", other, operator.add)

    def sub(self, other: SizeNode) -> SizeNode:
        return self._binary("sub", other, operator.sub)

    def mul(self, other: SizeNode) -> SizeNode:
        return self._binary("mul", other, operator.mul)

    def mod(self, other: SizeNode) -> SizeNode:
        return self._binary("mod", other, operator.mod)

    def floordiv(self, other: SizeNode) -> SizeNode:
        return self._binary("div", other, operator.floordiv)

    int_floordiv = floordiv

    def sym_min(self, other: SizeNode) -> SizeNode:
        return self._binary("sym_min", other, min)

    def sym_max(self, other: SizeNode) -> SizeNode:
        return self._binary("sym_max", other, max)

    # Comparisons: a boolean node on the real sizes.
    def _compare(
        self, name: builtins.str, other: SizeNode, fn: Callable[[int, int], bool]
    ) -> SizeBool:
        self._count(name)
        return SizeBool(fn(self.value, other.value))

    def eq(self, other: SizeNode) -> SizeBool:
        return self._compare("eq", other, operator.eq)

    def ne(self, other: SizeNode) -> SizeBool:
        return self._compare("ne", other, operator.ne)

    def ge(self, other: SizeNode) -> SizeBool:
        return self._compare("ge", other, operator.ge)

    def gt(self, other: SizeNode) -> SizeBool:
        return self._compare("gt", other, operator.gt)

    def lt(self, other: SizeNode) -> SizeBool:
        return self._compare("lt", other, operator.lt)

    def le(self, other: SizeNode) -> SizeBool:
        return self._compare("le", other, operator.le)

    def sym_eq(self, other: SizeNode) -> SizeBool:
        return self.eq(other)


class SizeBool:
    """The result of comparing sizes: its truth is the comparison of the real sizes; torch_xla
    refuses its text."""

    __slots__ = ("flag",)

    def __init__(self, flag: bool) -> None:
        self.flag = flag

    def is_int(self) -> bool:
        return False

    def is_float(self) -> bool:
        return False

    def is_bool(self) -> bool:
        return True

    def is_nested_int(self) -> bool:
        return False

    def is_symbolic(self) -> bool:
        return True

    def is_constant(self) -> bool:
        return False

    def has_hint(self) -> bool:
        return True

    def maybe_as_bool(self) -> bool | None:
        return None

    def wrap_bool(self, flag: bool) -> SizeBool:
        return SizeBool(flag)

    def str(self) -> str:
        raise RuntimeError(_COMPARISON_TEXT)

    def _graph_repr(self) -> builtins.str:
        raise RuntimeError(_COMPARISON_TEXT)

    def bool_(self) -> bool:
        return self.flag

    def guard_bool(self, file: Any = None, line: Any = None) -> bool:
        return self.flag

    def expect_true(self, file: Any = None, line: Any = None) -> bool:
        return self.flag

    def guard_or_false(self, file: Any = None, line: Any = None) -> bool:
        return self.flag

    def guard_or_true(self, file: Any = None, line: Any = None) -> bool:
        return self.flag

    def statically_known_true(self, file: Any = None, line: Any = None) -> bool:
        return self.flag

    def sym_and(self, other: SizeBool) -> SizeBool:
        return SizeBool(self.flag and other.flag)

    def sym_or(self, other: SizeBool) -> SizeBool:
        return SizeBool(self.flag or other.flag)

    def sym_not(self) -> SizeBool:
        return SizeBool(not self.flag)

    def clone(self) -> SizeBool:
        return SizeBool(self.flag)


def dynamic(bound: int, value: int, metrics: Any) -> torch.SymInt:
    """A dynamic dimension of real size ``value`` that XLA bounds by ``bound``."""
    return torch.SymInt(SizeNode(bound, value, metrics))


def is_dynamic(size: Any) -> bool:
    return isinstance(size, torch.SymInt) and isinstance(size.node, SizeNode)


def concrete(a: Any) -> Any:
    """``a`` with every dynamic size replaced by its real value (lists and tuples too)."""
    if isinstance(a, torch.SymInt):
        return int(a)
    if isinstance(a, (list, tuple)) and any(isinstance(x, torch.SymInt) for x in a):
        return type(a)(int(x) if isinstance(x, torch.SymInt) else x for x in a)
    return a


class Bound(int):
    """A dynamic dimension in an XLA shape: its bound, written ``<=N`` (``s32[<=6,1]``).
    Hashed apart from the static dimension of the same size: XLA compiles them apart."""

    def __str__(self) -> str:
        return f"<={int(self)}"

    __repr__ = __str__

    def __hash__(self) -> int:
        return hash((int(self), 1))


def xla_shape(t: torch.Tensor) -> tuple[int, ...]:
    """``t``'s XLA shape: its sizes, each dynamic one as its :class:`Bound`."""
    return tuple(Bound(_bound(s)) if is_dynamic(s) else int(s) for s in t.shape)


def _bound(size: Any) -> int:
    bound: int = size.node.bound
    return bound


def bounds(sizes: Any) -> tuple[int, ...]:
    """The static shape XLA gives sizes with dynamic dimensions: each at its bound (what its
    buffers hold)."""
    return tuple(_bound(s) if is_dynamic(s) else s for s in sizes)


def has_dynamic(t: torch.Tensor) -> bool:
    return any(is_dynamic(s) for s in t.shape)


def _mentions_dynamic(a: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return has_dynamic(a)
    if isinstance(a, (list, tuple)):
        return any(_mentions_dynamic(x) for x in a)
    return is_dynamic(a)


def involved(args: Any, kwargs: Any) -> bool:
    """Whether an op call has an operand with a dynamic dimension or a dynamic size."""
    return _mentions_dynamic(args) or bool(kwargs) and _mentions_dynamic(list(kwargs.values()))


def check_operands(op: Any, args: Any) -> None:
    """torch_xla's own refusals of operands with dynamic dimensions (messages as it words
    them, measured on torch_xla 2.9 CPU)."""
    name = _ONE_DYNAMIC_OPERAND.get(op)
    if (
        name is not None
        and len(args) > 1
        and all(isinstance(a, torch.Tensor) and has_dynamic(a) for a in args[:2])
    ):
        raise RuntimeError(
            "Check failed: !(tensor_has_dym_dim(self) && tensor_has_dym_dim(other)): "
            f"Both operands of torch.{name} cannot have dynamic dimensions at the same "
            "time. This is not supported in PyTorch/XLA."
        )
    if op in _VIEWS and has_dynamic(args[0]) and not _mentions_dynamic(args[1]):
        raise RuntimeError(
            "Check failed: !(input_has_dyn_shape && input_shape_static): This view op has "
            "dynamic input tensor but static input shape. This behavior is currently "
            "unsupported; if the user believes this must be supported, please file a feature "
            "request against PyTorch/XLA."
        )


def _at(a: Any, grow: int) -> Any:
    """``a`` for a shape computation on the meta device: each dynamic size at its bound plus
    ``grow``, each tensor an empty one of that shape."""
    if isinstance(a, torch.Tensor):
        shape = [_bound(s) + grow if is_dynamic(s) else int(s) for s in a.shape]
        return torch.empty(shape, dtype=a.dtype, device="meta")
    if isinstance(a, (list, tuple)):
        return type(a)(_at(x, grow) for x in a)
    if is_dynamic(a):
        return _bound(a) + grow
    return a


def _on_meta(op: Any, args: Any, kwargs: Any, grow: int) -> list[tuple[int, ...] | None]:
    """The op's result shapes with each dynamic size at its bound plus ``grow``: computed on
    the meta device by PyTorch's own kernels (not the Python dispatcher's decompositions, whose
    checks word their messages otherwise)."""
    with no_python_dispatcher():
        return _shapes(op(*_at(args, grow), **{k: _at(v, grow) for k, v in kwargs.items()}))


def _shapes(out: Any) -> list[tuple[int, ...] | None]:
    outs = out if isinstance(out, (list, tuple)) else [out]
    return [tuple(o.shape) if isinstance(o, torch.Tensor) else None for o in outs]


def _size_list(args: Any) -> list[Any] | None:
    """The size list among an op's arguments that names its output's shape (``expand``,
    ``view``, ``new_empty``...): the first list holding a dynamic size."""
    for a in args:
        if isinstance(a, (list, tuple)) and any(is_dynamic(x) for x in a):
            return list(a)
    return None


def static_shapes(op: Any, args: Any, kwargs: Any) -> list[tuple[int, ...] | None] | None:
    """The op's result shapes with every dynamic size at its bound: XLA's static shapes, which
    it checks as it builds the graph (a misfit raises PyTorch's RuntimeError, which the caller
    words as torch_xla does). None where the op cannot run on the meta device (a copy to the
    host)."""
    kwargs = kwargs or {}
    if "device" in kwargs:
        return None  # a copy between devices: no XLA shape to check
    try:
        return _on_meta(op, args, kwargs, 0)
    except NotImplementedError:
        return None
    except RuntimeError:
        if op not in _VIEWS:
            misfit = _broadcast_misfit(args)
            if misfit is None:
                raise
            raise misfit from None
    # torch_xla's view shape check, worded as it words it (measured on torch_xla 2.9 CPU).
    inputs = bounds(args[0].shape)
    outputs = bounds(args[1])
    raise RuntimeError(
        "Check failed: total_element_count == runtime::util::Multiply<int64_t>(output_sizes) "
        f"({math.prod(inputs)} vs. {math.prod(outputs)})({', '.join(map(str, outputs))}) vs. "
        f"({', '.join(map(str, inputs))})"
    )


def _broadcast_misfit(args: Any) -> RuntimeError | None:
    """PyTorch's own message for two operands whose static shapes do not broadcast (the meta
    kernels the Python dispatcher reaches word it otherwise), or None."""
    tensors = [a for a in args[:2] if isinstance(a, torch.Tensor)]
    if len(tensors) < 2:
        return None
    a, b = (bounds(t.shape) for t in tensors)
    rank = max(len(a), len(b))
    for dim in range(rank):
        x = a[dim - rank + len(a)] if dim - rank + len(a) >= 0 else 1
        y = b[dim - rank + len(b)] if dim - rank + len(b) >= 0 else 1
        if x != y and 1 not in (x, y):
            return RuntimeError(
                f"The size of tensor a ({x}) must match the size of tensor b ({y}) at "
                f"non-singleton dimension {dim}"
            )
    return None


def view_op(op: Any) -> bool:
    return op in _VIEWS


def view_misfit(op: Any, args: Any) -> RuntimeError | None:
    """PyTorch's refusal of a view whose real sizes do not match the tensor's, the sizes
    written as their text (``[<=6]``, an input of size ``<=7``), as torch_xla 2.9 reports it."""
    if op not in _VIEWS:
        return None
    shape = ", ".join(str(s) for s in args[1])
    return RuntimeError(f"shape '[{shape}]' is invalid for input of size {args[0].numel()}")


def output_sizes(
    op: Any, args: Any, kwargs: Any, out: Any, at_bounds: Any, metrics: Any
) -> list[list[Any] | None]:
    """The sizes of each tensor ``op`` returned, its dynamic dimensions as dynamic sizes.

    ``out`` is what the op computed on the real sizes, ``at_bounds`` its shapes at the bounds
    (from :func:`static_shapes`, or None to have them worked out here). An op given a size
    list with dynamic sizes (torch_xla's ``*_symint`` kernels) takes those sizes for its
    output. For the rest,
    XLA's shape inference decides which dimensions stay dynamic; the simulator finds them as
    the dimensions of the output that move when the dynamic inputs' bounds do, the output's
    static shape (its bounds) being the op's shape at the bounds, where XLA checks it.
    """
    kwargs = kwargs or {}
    real = _shapes(out)
    given = _size_list(args)
    if at_bounds is None:
        at_bounds = static_shapes(op, args, kwargs)
    if given is not None and len(real) == 1 and real[0] is not None and len(given) == len(real[0]):
        return [[g if is_dynamic(g) else r for g, r in zip(given, real[0], strict=True)]]
    try:
        grown = _on_meta(op, args, kwargs, 1)
    except (RuntimeError, NotImplementedError):
        grown = None
    if at_bounds is None or grown is None:
        raise NotImplementedError(
            f"xlasim does not simulate {op} on tensors with dynamic dimensions"
        )
    result: list[list[Any] | None] = []
    for r, b, g in zip(real, at_bounds, grown, strict=True):
        if r is None or b is None or g is None:
            result.append(None)
            continue
        result.append(
            [
                dynamic(bound, value, metrics) if bound != moved else value
                for value, bound, moved in zip(r, b, g, strict=True)
            ]
        )
    return result
