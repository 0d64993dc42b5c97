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


# An op's name, by id(op) (an OpOverload's own __hash__ and __str__ are Python calls, and a
# sync asks for every node's); the entry keeps the op alive, so an id is never reused.
_NAMES: dict[int, tuple[Any, str]] = {}
# Bounds the memos below: ops and leaf keys are few in a program (its parameters, inputs and
# op set), so reaching this means something is made per step, and starting over is cheap.
_MEMO_LIMIT = 8192


def _name_of(op: Any) -> str:
    entry = _NAMES.get(id(op))
    if entry is None or entry[0] is not op:
        if len(_NAMES) >= _MEMO_LIMIT:
            _NAMES.clear()
        entry = _NAMES[id(op)] = (op, _op_name(op))
    return entry[1]


def _broadcast(shapes: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    """``torch.broadcast_shapes`` (None where the shapes do not broadcast), in plain Python:
    it runs for every sharded elementwise value of a graph."""
    first = shapes[0] if shapes else ()
    if all(s == first for s in shapes):
        return tuple(first)
    out = [1] * max(len(s) for s in shapes)
    for s in shapes:
        offset = len(out) - len(s)
        for i, d in enumerate(s, offset):
            if d != out[i]:
                if out[i] != 1 and d != 1:
                    return None
                if out[i] == 1:
                    out[i] = d
    return tuple(out)


# (shape, sharding) of device-data leaves by their key: the same parameters and inputs feed
# every step's graph, and parsing their spec text back is most of a leaf's cost.  The
# shardings are never mutated, so sharing them between syncs is safe.
_LEAVES: dict[Any, tuple[tuple[int, ...], Any]] = {}


def _leaf(value: Any) -> tuple[tuple[int, ...] | None, Any]:
    """(shape, sharding) of a device-data leaf: InputInfo, or its (shape, dtype, spec) key."""
    found = _LEAVES.get(value)
    if found is not None:
        return found
    if isinstance(value, tuple):
        shape, spec = tuple(value[0]), value[2]
    else:
        shape, spec = tuple(value.shape), getattr(value, "sharding", "")
    op = parse_spec(spec)
    found = shape, (TensorSharding(op, shape) if op is not None else None)
    if len(_LEAVES) >= _MEMO_LIMIT:
        _LEAVES.clear()
    _LEAVES[value] = found
    return found


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


def _tiles(op: OpSharding | None) -> tuple[np.ndarray, int] | None:
    """A 2-D tiled sharding's device array, shape [d0, d1, replicas], and the replica count;
    None for anything else (unsharded, replicated, manual, other ranks)."""
    if op is None or op.proto_type in (ProtoType.REPLICATED, ProtoType.UNKNOWN):
        return None
    dims = list(op.tile_assignment_dimensions)
    replicas = dims.pop() if op.replicate_on_last_tile_dim else 1
    if op.proto_type != ProtoType.OTHER or len(dims) != 2:
        return None
    return np.array(op.tile_assignment_devices).reshape(*dims, replicas), replicas


def _tiled(devices: np.ndarray) -> OpSharding:
    """The sharding whose device array is ``devices`` ([d0, d1, replicas])."""
    if devices.shape[0] == devices.shape[1] == 1:
        return OpSharding.replicated()
    dims = list(devices.shape[:2])
    replicate = devices.shape[2] > 1
    if replicate:
        dims.append(devices.shape[2])
    return OpSharding.from_fields(
        ProtoType.OTHER, dims, devices.flatten().tolist(), last_tile_dim_replicate=replicate
    )


def _transposed_op(op: OpSharding) -> Any:
    tiles = _tiles(op)
    if tiles is None:
        return UNKNOWN
    return _tiled(tiles[0].transpose(1, 0, 2))


def _matmul_op(a: OpSharding | None, b: OpSharding | None) -> Any:
    """GSPMD's sharding of ``a @ b`` (2-D) where one side is replicated, or where only the
    contracted dimension is split (a partial sum, all-reduced): the kept dimension keeps its
    tiles and the devices that held pieces of the contracted one replicate the result
    (measured on torch_xla 2.9, 4 devices, (1, 4) and (2, 2) meshes)."""
    a_tiles, b_tiles = _tiles(a), _tiles(b)
    if (a_tiles is None and not _unsharded_op(a)) or (b_tiles is None and not _unsharded_op(b)):
        return UNKNOWN  # manual, or not a 2-D tiling
    if a_tiles is not None and b_tiles is not None:
        only_contracted = a_tiles[0].shape[0] == 1 and b_tiles[0].shape[1] == 1
        return OpSharding.replicated() if only_contracted else UNKNOWN
    if a_tiles is not None:
        devices = a_tiles[0]  # [m, k, replicas]
        return _tiled(devices.reshape(devices.shape[0], 1, -1))
    if b_tiles is not None:
        devices = b_tiles[0].transpose(1, 0, 2)  # [n, k, replicas]
        return _tiled(devices.reshape(1, devices.shape[0], -1))
    return OpSharding.replicated()


def _unsharded_op(op: OpSharding | None) -> bool:
    return op is None or op.proto_type in (ProtoType.REPLICATED, ProtoType.UNKNOWN)


# Results of the tile arithmetic above by rule and input OpShardings (by identity: the entry
# keeps them alive): a graph applies it to the same few shardings over and over (a layer's
# weights share their leaf's), and every step's graph meets them again.
_DERIVED: dict[tuple[Any, ...], tuple[tuple[Any, ...], Any]] = {}


def _derive(rule: Any, *ops: OpSharding | None) -> Any:
    key = (rule, *map(id, ops))
    entry = _DERIVED.get(key)
    if entry is None or any(a is not b for a, b in zip(entry[0], ops, strict=True)):
        if len(_DERIVED) >= _MEMO_LIMIT:
            _DERIVED.clear()
        entry = _DERIVED[key] = (ops, rule(*ops))
    return entry[1]


def _transposed(s: Any, shape: tuple[int, ...]) -> Any:
    op = _derive(_transposed_op, s.op)
    return UNKNOWN if op is UNKNOWN else TensorSharding(op, shape)


def _matmul(a: Any, b: Any, shape: tuple[int, ...]) -> Any:
    """:func:`_matmul_op` of two (shape, sharding) shardings."""
    if a is UNKNOWN or b is UNKNOWN:
        return UNKNOWN
    op = _derive(_matmul_op, None if a is None else a.op, None if b is None else b.op)
    return UNKNOWN if op is UNKNOWN else TensorSharding(op, shape)


def _is_replicated(s: Any) -> bool:
    return s is not UNKNOWN and s.is_replicated


# (shape, sharding) of a value downstream of one whose sharding only GSPMD could tell.
_ABSORBED: tuple[None, Any] = (None, UNKNOWN)


def _combine(
    op: Any, shape: tuple[int, ...] | None, parts: list[tuple[Any, Any]]
) -> tuple[tuple[int, ...] | None, Any]:
    """(shape, sharding) of an op's output of ``shape`` (None: not recorded) from its inputs'
    (shape, sharding)."""
    sharded = False
    for _, s in parts:
        if s is None:
            continue
        if s is UNKNOWN:
            # GSPMD's choice upstream makes this value's sharding its choice too: every rule
            # below needs its inputs' shardings.
            return _ABSORBED
        if not sharded and not s.is_replicated:
            sharded = True
    shapes = [shape for shape, _ in parts]
    name = _name_of(op)
    if not sharded:
        # Nothing sharded upstream: the output is replicated.
        return (shape if shape is not None else _out_shape(name, shapes)), None
    shardings = [s for _, s in parts]
    if name == "t" and len(parts) == 1:
        out = _out_shape(name, shapes)
        return (out, _transposed(shardings[0], out)) if out is not None else (None, UNKNOWN)
    if name in _MATMUL_NAMES:
        out = _out_shape(name, shapes)
        bias = shardings[0] if name == "addmm" else None
        if out is None or len(parts) < 2 or (bias is not None and not _is_replicated(bias)):
            return None, UNKNOWN
        return out, _matmul(shardings[-2], shardings[-1], out)
    if name in _ELEMENTWISE_NAMES and all(shape is not None for shape in shapes):
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
        found = memo.get(id(value))
        if found is not None:
            return found
        # A value stays on the stack until its inputs are settled, then is settled itself.
        stack = [value]
        push, pop = stack.append, stack.pop
        while stack:
            item = stack[-1]
            key = id(item)
            if key in memo:
                pop()
                continue
            inputs = getattr(item, "inputs", None)
            if inputs is None:
                memo[key] = _leaf(item)
                pop()
                continue
            annotation = getattr(item, "sharding", None)
            if annotation is not None:
                # A value the program annotated (mark_sharding of a pending tensor).
                memo[key] = (tuple(annotation.shape), annotation)
                pop()
                continue
            missing = sharded = unknown = False
            for i in inputs:
                part = memo.get(id(i))
                if part is None:
                    push(i)
                    missing = True
                elif part[1] is not None:
                    sharded = True
                    unknown = unknown or part[1] is UNKNOWN
            if missing:
                continue
            pop()
            # What _combine gives, without building the inputs' lists, for the two kinds of
            # value most graphs consist of: nothing annotated upstream, or GSPMD's choice.
            shape = getattr(item, "shape", None)
            if unknown:
                memo[key] = _ABSORBED
            elif not sharded and shape is not None:
                memo[key] = (shape, None)
            else:
                parts = [memo[id(i)] for i in inputs]
                memo[key] = _combine(item.op, None if shape is None else tuple(shape), parts)
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
