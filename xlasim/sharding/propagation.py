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
  t.t() (2-D)                  t's tiles transposed ('{devices=[1,2,2]0,1,2,3
                               last_tile_dim_replicate}')
  a @ w, addmm, nn.Linear      a's row tiles when w is replicated, w's column tiles
  (2-D, one side sharded)      when a is; the devices of a split contracted
                               dimension replicate the result
  t.view(48), a @ w both       propagated shardings -- not simulated
  sharded in kept dimensions
  ===========================  =================================================

:func:`output_sharding` returns the sharding for the rows above the last and
:data:`UNKNOWN` otherwise, so the simulator never reports a propagated sharding it cannot
derive.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
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

# 2-D matrix products: (a, b), and addmm's (bias, a, b).
_MATMUL_NAMES = {"mm", "addmm"}

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


def _out_shape(name: str, shapes: list[tuple[int, ...] | None]) -> tuple[int, ...] | None:
    """The output shape of the ops whose shardings are derived from their inputs' shapes
    (None for any other op, or when an input's shape is not known)."""
    if any(shape is None for shape in shapes):
        return None
    if name == "t" and len(shapes) == 1 and len(shapes[0]) == 2:  # type: ignore[arg-type]
        return shapes[0][::-1]  # type: ignore[index]
    matrices = shapes[-2:]
    if name in _MATMUL_NAMES and len(matrices) == 2 and all(len(s) == 2 for s in matrices):  # type: ignore[arg-type]
        (m, k), (k2, n) = matrices  # type: ignore[misc]
        return (m, n) if k == k2 else None
    if name in _ELEMENTWISE_NAMES:
        return _broadcast(shapes)  # type: ignore[arg-type]
    return None


def _tiles(s: Any) -> tuple[np.ndarray, int] | None:
    """A 2-D tiled (or replicated) sharding's device array, shape [d0, d1, replicas], and
    the replica count; None for anything else (manual, unknown, other ranks)."""
    if s is None or s.is_replicated:
        return None
    op = s.op
    dims = list(op.tile_assignment_dimensions)
    replicas = dims.pop() if op.replicate_on_last_tile_dim else 1
    if op.proto_type != ProtoType.OTHER or len(dims) != 2:
        return None
    return np.array(op.tile_assignment_devices).reshape(*dims, replicas), replicas


def _tiled(devices: np.ndarray, shape: tuple[int, ...]) -> TensorSharding:
    """The sharding whose device array is ``devices`` ([d0, d1, replicas])."""
    if devices.shape[0] == devices.shape[1] == 1:
        return TensorSharding(OpSharding.replicated(), shape)
    dims = list(devices.shape[:2])
    replicate = devices.shape[2] > 1
    if replicate:
        dims.append(devices.shape[2])
    op = OpSharding.from_fields(
        ProtoType.OTHER, dims, devices.flatten().tolist(), last_tile_dim_replicate=replicate
    )
    return TensorSharding(op, shape)


def _transposed(s: Any, shape: tuple[int, ...]) -> Any:
    tiles = _tiles(s)
    if tiles is None:
        return UNKNOWN
    return _tiled(tiles[0].transpose(1, 0, 2), shape)


def _matmul(a: Any, b: Any, shape: tuple[int, ...]) -> Any:
    """GSPMD's sharding of ``a @ b`` (2-D) where one side is replicated, or where only the
    contracted dimension is split (a partial sum, all-reduced): the kept dimension keeps its
    tiles and the devices that held pieces of the contracted one replicate the result
    (measured on torch_xla 2.9, 4 devices, (1, 4) and (2, 2) meshes)."""
    if a is UNKNOWN or b is UNKNOWN:
        return UNKNOWN
    a_tiles, b_tiles = _tiles(a), _tiles(b)
    if (a_tiles is None and not _unsharded(a)) or (b_tiles is None and not _unsharded(b)):
        return UNKNOWN  # manual, or not a 2-D tiling
    if a_tiles is not None and b_tiles is not None:
        only_contracted = a_tiles[0].shape[0] == 1 and b_tiles[0].shape[1] == 1
        return TensorSharding(OpSharding.replicated(), shape) if only_contracted else UNKNOWN
    if a_tiles is not None:
        devices = a_tiles[0]  # [m, k, replicas]
        return _tiled(devices.reshape(devices.shape[0], 1, -1), shape)
    if b_tiles is not None:
        devices = b_tiles[0].transpose(1, 0, 2)  # [n, k, replicas]
        return _tiled(devices.reshape(1, devices.shape[0], -1), shape)
    return TensorSharding(OpSharding.replicated(), shape)


def _unsharded(s: Any) -> bool:
    return s is None or (s is not UNKNOWN and s.is_replicated)


def _is_replicated(s: Any) -> bool:
    return s is not UNKNOWN and s.is_replicated


def _combine(
    op: Any, shape: tuple[int, ...] | None, parts: list[tuple[Any, Any]]
) -> tuple[tuple[int, ...] | None, Any]:
    """(shape, sharding) of an op's output of ``shape`` (None: not recorded) from its inputs'
    (shape, sharding)."""
    shardings = [s for _, s in parts]
    shapes = [shape for shape, _ in parts]
    name = _op_name(op)
    if all(s is None or (s is not UNKNOWN and s.is_replicated) for s in shardings):
        # Nothing sharded upstream: the output is replicated.
        return (shape if shape is not None else _out_shape(name, shapes)), None
    if name == "t" and len(parts) == 1:
        out = _out_shape(name, shapes)
        return (out, _transposed(shardings[0], out)) if out is not None else (None, UNKNOWN)
    if name in _MATMUL_NAMES:
        out = _out_shape(name, shapes)
        bias = shardings[0] if name == "addmm" else None
        if out is None or len(parts) < 2 or (bias is not None and not _is_replicated(bias)):
            return None, UNKNOWN
        return out, _matmul(shardings[-2], shardings[-1], out)
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
