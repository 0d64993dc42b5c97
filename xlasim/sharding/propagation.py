"""The shardings XLA's SPMD partitioner gives graph outputs -- for the cases known exactly.

After ``torch_xla.sync()`` real torch_xla reports, for every output of an SPMD graph, the
sharding GSPMD propagated to it (checked on PJRT CPU, 4 devices, t sharded ('x', None) on a
(2, 2) mesh):

  ===========================  =================================================
  result                       ``_get_xla_sharding_spec`` after sync
  ===========================  =================================================
  a + b, nothing sharded       '{replicated}' (and so are a and b)
  t.relu(), t * b, t + 1       t's sharding
  t.sum(), loss (rank 0)       '{replicated}'
  t @ w, t.t(), t.view(48)     propagated shardings (e.g. '{devices=[1,2,2]0,1,2,3
                               last_tile_dim_replicate}' for t.t()) -- not simulated
  ===========================  =================================================

:func:`output_sharding` returns the sharding for the first three rows and :data:`UNKNOWN`
otherwise, so the simulator never reports a propagated sharding it cannot derive.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from xlasim.sharding.op_sharding import OpSharding, ProtoType
from xlasim.sharding.tensor_sharding import TensorSharding

aten = torch.ops.aten

UNKNOWN: Any = object()

# Ops whose output element i depends only on input elements i (after broadcasting): GSPMD
# gives the output the sharding of its same-shaped sharded input.
_ELEMENTWISE_NAMES = {
    "abs", "add", "add_", "clamp", "clone", "cos", "div", "div_", "exp", "gelu", "log",
    "mul", "mul_", "neg", "pow", "relu", "relu_", "rsqrt", "sigmoid", "sin", "sqrt", "sub",
    "sub_", "tanh", "threshold_backward", "where", "maximum", "minimum", "silu", "copy_",
    "_to_copy", "sigmoid_backward", "tanh_backward", "gelu_backward", "lerp_",
    "addcmul_", "addcdiv_", "mul_.Tensor",
}  # fmt: skip

_SPEC_RE = re.compile(r"^\{devices=\[([\d,]+)\]([\d,]+)( last_tile_dim_replicate)?\}$")


def parse_spec(text: str) -> OpSharding | None:
    """An OpSharding back from its ``HloSharding::ToString`` form ('' gives None)."""
    if text == "":
        return None
    if text == "{replicated}":
        return OpSharding.replicated()
    if text == "{manual}":
        return OpSharding.manual()
    m = _SPEC_RE.match(text)
    if m is None:
        raise ValueError(f"not a sharding spec string this simulator produces: {text!r}")
    dims = [int(d) for d in m.group(1).split(",")]
    devices = [int(d) for d in m.group(2).split(",")]
    return OpSharding.from_fields(ProtoType.OTHER, dims, devices, bool(m.group(3)))


def _op_name(op: Any) -> str:
    name = getattr(op, "__name__", None) or str(op)
    return name.split("::")[-1].split(".")[0]


def _broadcast(shapes: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    try:
        return tuple(torch.broadcast_shapes(*shapes))
    except RuntimeError:
        return None


def _leaf(value: Any) -> tuple[tuple[int, ...] | None, Any]:
    """(shape, sharding) of a device-data leaf: InputInfo, or its (shape, dtype, spec) key."""
    if isinstance(value, tuple):
        shape, spec = tuple(value[0]), value[2]
    else:
        shape, spec = tuple(value.shape), getattr(value, "sharding", "")
    op = parse_spec(spec)
    return shape, (TensorSharding(op, shape) if op is not None else None)


def _combine(
    op: Any, shape: tuple[int, ...] | None, parts: list[tuple[Any, Any]]
) -> tuple[tuple[int, ...] | None, Any]:
    """(shape, sharding) of an op's output of ``shape`` (None: not known) from its inputs'
    (shape, sharding)."""
    shardings = [s for _, s in parts]
    if all(s is None or (s is not UNKNOWN and s.is_replicated) for s in shardings):
        return shape, None  # nothing sharded upstream: the output is replicated
    shapes = [shape for shape, _ in parts]
    if _op_name(op) in _ELEMENTWISE_NAMES and all(shape is not None for shape in shapes):
        out_shape = _broadcast(shapes)
        tiled = [
            s
            for (shape, s) in parts
            if s is not None and s is not UNKNOWN and not s.is_replicated and shape == out_shape
        ]
        annotated = [
            s for s in shardings if s is UNKNOWN or (s is not None and not s.is_replicated)
        ]
        if (
            out_shape is not None
            and tiled
            and len(tiled) == len(annotated)
            and all(s.same_as(tiled[0]) for s in tiled)
        ):
            return out_shape, TensorSharding(tiled[0].op, out_shape)
    return None, UNKNOWN


class Propagation:
    """Infers graph values' (shape, sharding), each value once however many consumers it has.

    One instance serves one sync: the memo is keyed by the values' ids, which stay valid while
    the graph being settled holds them.  The walk is iterative, so graph depth is unbounded.
    """

    def __init__(self) -> None:
        self._memo: dict[int, tuple[Any, Any]] = {}

    def infer(self, value: Any) -> tuple[tuple[int, ...] | None, Any]:
        """(shape, sharding) of a graph value: a Node, or a leaf with ``shape`` and
        ``sharding``.  The sharding is a TensorSharding, None (no annotation anywhere
        upstream) or UNKNOWN."""
        memo = self._memo
        stack: list[tuple[Any, bool]] = [(value, False)]
        while stack:
            item, expanded = stack.pop()
            key = id(item)
            if key in memo:
                continue
            inputs = getattr(item, "inputs", None)
            annotation = getattr(item, "sharding", None) if inputs is not None else None
            if inputs is None:
                memo[key] = _leaf(item)
            elif annotation is not None:
                # A value the program annotated (mark_sharding of a pending tensor).
                memo[key] = (tuple(annotation.shape), annotation)
            elif expanded:
                shape = getattr(item, "shape", None)
                memo[key] = _combine(
                    item.op, None if shape is None else tuple(shape), [memo[id(i)] for i in inputs]
                )
            else:
                stack.append((item, True))
                stack.extend((i, False) for i in inputs if id(i) not in memo)
        return memo[id(value)]

    def output_sharding(self, t: Any) -> Any:
        """The sharding real torch_xla reports for graph output ``t`` after the step: a
        TensorSharding (replicated when nothing upstream is sharded) or UNKNOWN."""
        node = getattr(t, "_node", None)
        if node is None:
            return t._sharding
        shape, sharding = self.infer(node)
        if sharding is None:
            return TensorSharding(OpSharding.replicated(), tuple(t.shape))
        if t.dim() == 0:  # a rank-0 value cannot be tiled
            return TensorSharding(OpSharding.replicated(), ())
        if sharding is UNKNOWN or shape != tuple(t.shape):
            return UNKNOWN
        return sharding


def output_sharding(t: Any) -> Any:
    """:meth:`Propagation.output_sharding` for one tensor (a sync settles all its outputs
    with one :class:`Propagation`)."""
    return Propagation().output_sharding(t)
