"""XLA computations built op by op from Python (torch_xla's ``xla_builder``), and running them.

torch_xla hands each op to XLA's C++ ``XlaBuilder`` and runs the finished computation as one
user-computation IR node.  The simulator keeps the op graph here instead: an op's shape comes
from evaluating it on meta tensors when it is added (so shape errors surface while building, as
XLA's shape inference makes them), and running a computation evaluates the same graph with
torch ops on the inputs' values.  Ops torch_xla knows but the simulator does not evaluate raise
NotImplementedError when they are added.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch

XLA_TO_TORCH: dict[str, torch.dtype] = {
    "f32": torch.float32,
    "f64": torch.float64,
    "bf16": torch.bfloat16,
    "f16": torch.float16,
    "u8": torch.uint8,
    "s8": torch.int8,
    "u16": torch.uint16,
    "s16": torch.int16,
    "u32": torch.uint32,
    "s32": torch.int32,
    "u64": torch.uint64,
    "s64": torch.int64,
    "c64": torch.complex64,
    "c128": torch.complex128,
    "pred": torch.bool,
}
TORCH_TO_XLA: dict[torch.dtype, str] = {v: k for k, v in XLA_TO_TORCH.items()}

_META = torch.device("meta")
# A value in the graph: one array, or a tuple of values (XLA tuples nest).
Value = Any


def xla_type(dtype: torch.dtype) -> str:
    try:
        return TORCH_TO_XLA[dtype]
    except KeyError:
        raise NotImplementedError(f"xlasim: no XLA element type for {dtype}") from None


def shape_of(value: Value) -> Any:
    """torch_xla's Python form of an XLA shape: ``{'type': 'f32', 'sizes': (2, 3)}``, or a
    tuple of those for a tuple shape."""
    if isinstance(value, tuple):
        return tuple(shape_of(v) for v in value)
    return {"type": xla_type(value.dtype), "sizes": tuple(value.shape)}


def shape_text(value: Value) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join(shape_text(v) for v in value) + ")"
    return f"{xla_type(value.dtype)}[{','.join(map(str, value.shape))}]"


def _from_shape(shape: Any, device: torch.device) -> Value:
    """A placeholder value (zeros) of a Python-form shape."""
    if isinstance(shape, (list, tuple)):
        return tuple(_from_shape(s, device) for s in shape)
    if shape.get("dynamic_dimensions"):
        raise NotImplementedError("xlasim does not simulate dynamic dimensions in xla_builder")
    try:
        dtype = XLA_TO_TORCH[shape["type"]]
    except KeyError:
        raise RuntimeError(f"Unknown XLA primitive type: {shape['type']}") from None
    return torch.zeros(tuple(shape["sizes"]), dtype=dtype, device=device)


class XlaBuilder:
    """One computation under construction; like XLA's builder it keeps the first error, and
    every later shape query or build reports it."""

    _ids = itertools.count()

    def __init__(self, name: str) -> None:
        self.name = name
        self.params: dict[int, XlaOp] = {}
        self.error: Exception | None = None
        self.id = next(self._ids)

    def __repr__(self) -> str:
        return f"<xlasim XlaBuilder {self.name!r}>"


class XlaOp:
    """One op of a builder's graph: what it is, what it consumes, and its meta-tensor value
    (None once the builder has failed)."""

    __slots__ = ("builder", "kind", "operands", "attrs", "meta")

    def __init__(
        self,
        builder: XlaBuilder,
        kind: str,
        operands: tuple[XlaOp, ...],
        attrs: dict[str, Any],
        meta: Value,
    ) -> None:
        self.builder = builder
        self.kind = kind
        self.operands = operands
        self.attrs = attrs
        self.meta = meta


class XlaComputation:
    """A built computation: its root and parameters, and a fingerprint of the graph (what a
    user-computation IR node hashes)."""

    def __init__(self, name: str, builder: XlaBuilder, root: XlaOp) -> None:
        self.name = name
        self.builder = builder
        self.root = root
        count = len(builder.params)
        missing = [i for i in range(count) if i not in builder.params]
        if missing:
            raise RuntimeError(f"Parameter {missing[0]} missing from computation {name}")
        self.params = [builder.params[i] for i in range(count)]
        self.fingerprint = _fingerprint(root)

    def param_shapes(self) -> list[Any]:
        return [shape_of(p.meta) for p in self.params]

    def result_shape(self) -> Any:
        return shape_of(self.root.meta)

    def __repr__(self) -> str:
        return f"<xlasim XlaComputation {self.name!r}>"


def _fingerprint(root: XlaOp) -> int:
    digest = hashlib.sha256()
    numbering: dict[int, int] = {}
    for op in _topological(root):
        numbering[id(op)] = len(numbering)
        parts = [op.kind, [numbering[id(o)] for o in op.operands]]
        for key, value in sorted(op.attrs.items()):
            if isinstance(value, XlaComputation):
                value = ("computation", value.fingerprint)
            elif isinstance(value, torch.Tensor):
                value = (str(value.dtype), tuple(value.shape), value.cpu().numpy().tobytes())
            parts.append((key, value))
        parts.append(shape_text(op.meta))
        digest.update(repr(parts).encode())
    return int.from_bytes(digest.digest()[:8], "little")


def _topological(root: XlaOp) -> list[XlaOp]:
    order: list[XlaOp] = []
    seen: set[int] = set()
    stack: list[tuple[XlaOp, bool]] = [(root, False)]
    while stack:
        op, done = stack.pop()
        if done:
            order.append(op)
            continue
        if id(op) in seen:
            continue
        seen.add(id(op))
        stack.append((op, True))
        stack.extend((o, False) for o in reversed(op.operands))
    return order


# --- building -------------------------------------------------------------------------------


def create_builder(name: str) -> XlaBuilder:
    return XlaBuilder(name)


def parameter(builder: XlaBuilder, number: int, shape: Any) -> XlaOp:
    if number in builder.params:
        raise RuntimeError(f"parameter {number} already registered in {builder.name}")
    op = XlaOp(builder, "Parameter", (), {"number": number}, _from_shape(shape, _META))
    builder.params[number] = op
    return op


def create_op(builder: XlaBuilder, name: str, operands: Sequence[XlaOp], attrs: dict) -> XlaOp:
    """Adds op ``name`` (torch_xla's op names: ``'Add'``, ``'Reshape'``...) to ``builder``."""
    impl = _OPS.get(name)
    if impl is None:
        if name in _NOT_SIMULATED:
            raise NotImplementedError(
                f"xlasim does not simulate the XLA builder op {name!r} "
                f"(torch_xla.core.xla_builder); simulated: {', '.join(sorted(_OPS))}"
            )
        raise RuntimeError(f"Unknown XLA op name: {name}")
    attrs = {k: v for k, v in attrs.items() if k != "builder"}
    operands = tuple(operands)
    # The start indices of the dynamic slices are ops passed as attributes: they are inputs.
    if "start_indices" in attrs and name in ("DynamicSlice", "DynamicUpdateSlice"):
        operands = operands + tuple(attrs.pop("start_indices"))
    for o in operands:
        if not isinstance(o, XlaOp):
            raise TypeError(f"xla_builder op {name}: operand {o!r} is not an XLA op")
        if o.builder is not builder:
            raise RuntimeError(
                f"XlaOp with handle from builder {o.builder.name} is used in builder {builder.name}"
            )
    meta = None
    if builder.error is None:
        try:
            meta = impl(tuple(o.meta for o in operands), attrs, True)
        except NotImplementedError:
            raise
        except (RuntimeError, ValueError, IndexError, TypeError) as exc:
            builder.error = exc if isinstance(exc, RuntimeError) else RuntimeError(str(exc))
    return XlaOp(builder, name, operands, attrs, meta)


def op_shape(op: XlaOp) -> Any:
    if op.builder.error is not None:
        raise op.builder.error
    return shape_of(op.meta)


def build(name: str, root: XlaOp) -> XlaComputation:
    if root.builder.error is not None:
        raise root.builder.error
    return XlaComputation(name, root.builder, root)


# --- running --------------------------------------------------------------------------------


def evaluate(
    computation: XlaComputation, args: Sequence[Value], meta: bool = False, exact: bool = True
) -> Value:
    """The computation's result for ``args`` (meta: shapes only, control flow not taken).

    ``exact=False`` lets a scalar computation run elementwise on same-typed arrays (a
    reduction folds whole slices at once)."""
    if len(args) != len(computation.params):
        raise RuntimeError(
            f"Computation {computation.name} takes {len(computation.params)} parameters, "
            f"got {len(args)}"
        )
    values: dict[int, Value] = {}
    for p, a in zip(computation.params, args, strict=True):
        if exact and shape_of(p.meta) != shape_of(a):
            raise RuntimeError(
                f"Computation {computation.name} parameter {p.attrs['number']} expects "
                f"{shape_text(p.meta)}, got {shape_text(a)}"
            )
        values[id(p)] = a
    for op in _topological(computation.root):
        if id(op) in values:
            continue
        if op.kind == "Parameter":
            raise RuntimeError(f"parameter {op.attrs['number']} of another computation")
        ins = tuple(values[id(o)] for o in op.operands)
        values[id(op)] = _OPS[op.kind](ins, op.attrs, meta)
    return values[id(computation.root)]


def flatten(value: Value) -> list[torch.Tensor]:
    """The arrays of a result in order (a tuple result gives each element)."""
    if isinstance(value, tuple):
        return [t for v in value for t in flatten(v)]
    return [value]


# --- the ops --------------------------------------------------------------------------------

OpImpl = Callable[[tuple[Value, ...], dict, bool], Value]
_OPS: dict[str, OpImpl] = {}

# torch_xla 2.9's op table entries the simulator does not evaluate.
_NOT_SIMULATED = frozenset(
    {
        "Clz",
        "Conv",
        "ConvGeneral",
        "ConvGeneralDilated",
        "ConvWithGeneralDimensions",
        "ConvWithGeneralPadding",
        "DynamicReshape",
        "Gather",
        "Map",
        "MaxPool",
        "ReduceWindow",
        "Scatter",
        "SelectAndScatter",
        "SelectAndScatterWithGeneralPadding",
        "SetDimensionSize",
        "Sort",
    }
)


def _op(name: str) -> Callable[[OpImpl], OpImpl]:
    def register(fn: OpImpl) -> OpImpl:
        _OPS[name] = fn
        return fn

    return register


def _unary(name: str, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
    _OPS[name] = lambda ins, attrs, meta: fn(ins[0])


for _name, _fn in {
    "Abs": torch.abs,
    "Acos": torch.acos,
    "Asin": torch.asin,
    "Atan": torch.atan,
    "Ceil": torch.ceil,
    "Conj": torch.conj_physical,
    "Cos": torch.cos,
    "Cosh": torch.cosh,
    "Erf": torch.erf,
    "Erfc": torch.erfc,
    "ErfInv": torch.erfinv,
    "Exp": torch.exp,
    "Expm1": torch.expm1,
    "Floor": torch.floor,
    "Imag": torch.imag,
    "Log": torch.log,
    "Log1p": torch.log1p,
    "Neg": torch.neg,
    "Real": torch.real,
    "Rsqrt": torch.rsqrt,
    "Sin": torch.sin,
    "Sinh": torch.sinh,
    "Sqrt": torch.sqrt,
    "Square": torch.square,
    "Tan": torch.tan,
    "Tanh": torch.tanh,
}.items():
    _unary(_name, _fn)


@_op("Not")
def _not(ins: tuple[Value, ...], attrs: dict, meta: bool) -> Value:
    x = ins[0]
    return torch.logical_not(x) if x.dtype == torch.bool else torch.bitwise_not(x)


def _check_binary(hlo_name: str, a: torch.Tensor, b: torch.Tensor) -> None:
    """XLA's element-type and shape rules for a binary op: the same element type, and the
    same shape unless one side is a scalar."""
    if a.dtype != b.dtype:
        raise RuntimeError(
            f"Binary op {hlo_name} with different element types: {shape_text(a)} and "
            f"{shape_text(b)}."
        )
    if a.dim() == 0 or b.dim() == 0 or a.shape == b.shape:
        return
    if a.dim() != b.dim():
        raise RuntimeError(
            f"Shapes must be equal rank, but are {shape_text(b)} and {shape_text(a)}"
        )
    raise RuntimeError(
        f"Binary op {hlo_name} with incompatible shapes: {shape_text(a)} and {shape_text(b)}."
    )


def _divide(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.dtype.is_floating_point or a.dtype.is_complex:
        return torch.div(a, b)
    return torch.div(a, b, rounding_mode="trunc")  # XLA's integer division truncates


def _binary(name: str, hlo_name: str, fn: Callable[[Any, Any], torch.Tensor]) -> None:
    def run(ins: tuple[Value, ...], attrs: dict, meta: bool) -> Value:
        a, b = ins
        _check_binary(hlo_name, a, b)
        out = fn(a, b)
        # torch promotes a 0-dim operand against a tensor; XLA keeps the operands' type.
        return out if out.dtype in (a.dtype, torch.bool) else out.to(a.dtype)

    _OPS[name] = run


for _name, _hlo, _bfn in (
    ("Add", "add", torch.add),
    ("Sub", "subtract", torch.sub),
    ("Mul", "multiply", torch.mul),
    ("Div", "divide", _divide),
    ("Rem", "remainder", torch.fmod),  # XLA's remainder takes the dividend's sign
    ("Pow", "power", torch.pow),
    ("Max", "maximum", torch.maximum),
    ("Min", "minimum", torch.minimum),
    ("Atan2", "atan2", torch.atan2),
    ("And", "and", torch.bitwise_and),
    ("Or", "or", torch.bitwise_or),
    ("Xor", "xor", torch.bitwise_xor),
    ("ShiftLeft", "shift-left", torch.bitwise_left_shift),
    # XLA's ``>>`` on ops: arithmetic for signed types, logical for unsigned, as torch's.
    ("ShifRight", "shift-right-arithmetic", torch.bitwise_right_shift),
    ("Eq", "compare", torch.eq),
    ("Ne", "compare", torch.ne),
    ("Lt", "compare", torch.lt),
    ("Le", "compare", torch.le),
    ("Gt", "compare", torch.gt),
    ("Ge", "compare", torch.ge),
):
    _binary(_name, _hlo, _bfn)


@_op("Constant")
def _constant(ins: tuple[Value, ...], attrs: dict, meta: bool) -> Value:
    value = attrs["value"]
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"Constant value must be a tensor, got {type(value).__name__}")
    return value.to(_META) if meta else value.detach().to("cpu", copy=True)


@_op("Iota")
def _iota(ins: tuple[Value, ...], attrs: dict, meta: bool) -> Value:
    shape = attrs["shape"]
    dim = attrs["iota_dimension"]
    out = _from_shape(shape, _META if meta else torch.device("cpu"))
    if not 0 <= dim < out.dim():
        raise RuntimeError(f"Iota dimension {dim} out of range for {shape_text(out)}")
    view = [1] * out.dim()
    view[dim] = out.shape[dim]
    steps = torch.arange(out.shape[dim], device=out.device).to(out.dtype)
    return steps.reshape(view).expand(out.shape).clone()


@_op("Tuple")
def _tuple(ins: tuple[Value, ...], attrs: dict, meta: bool) -> Value:
    return tuple(ins)


@_op("GetTupleElement")
def _get_tuple_element(ins: tuple[Value, ...], attrs: dict, meta: bool) -> Value:
    value, index = ins[0], attrs["index"]
    if not isinstance(value, tuple):
        raise RuntimeError(f"Operand to GetTupleElement() is not a tuple; got {shape_text(value)}")
    if not 0 <= index < len(value):
        raise RuntimeError(
            f"Cannot infer shape: attempt to index out of tuple bounds: {index} >= "
            f"{len(value)} in shape {shape_text(value)}."
        )
    return value[index]


@_op("Convert")
def _convert(ins: tuple[Value, ...], attrs: dict, meta: bool) -> Value:
    to = attrs["to_type"]
    if to not in XLA_TO_TORCH:
        raise RuntimeError(f'Invalid element type string: "{to}".')
    return ins[0].to(XLA_TO_TORCH[to])


@_op("BitcastConvert")
def _bitcast(ins: tuple[Value, ...], attrs: dict, meta: bool) -> Value:
    x, to = ins[0], XLA_TO_TORCH[attrs["to_type"]]
    if x.element_size() != torch.empty((), dtype=to).element_size():
        raise NotImplementedError("xlasim simulates BitcastConvert between same-width types only")
    return x.contiguous().view(to)


@_op("Reshape")
def _reshape(ins: tuple[Value, ...], attrs: dict, meta: bool) -> Value:
    x = ins[0]
    if attrs.get("dimensions") is not None:
        x = x.permute(tuple(attrs["dimensions"]))
    sizes = tuple(attrs["sizes"])
    if x.numel() != _prod(sizes):
        raise RuntimeError(
            f"Cannot reshape {shape_text(x)} to sizes {list(sizes)}: element counts differ"
        )
    return x.reshape(sizes)


def _prod(sizes: Sequence[int]) -> int:
    n = 1
    for s in sizes:
        n *= s
    return n


@_op("Broadcast")
def _broadcast(ins: tuple[Value, ...], attrs: dict, meta: bool) -> Value:
    x, sizes = ins[0], tuple(attrs["sizes"])
    return x.reshape((1,) * len(sizes) + tuple(x.shape)).expand(sizes + tuple(x.shape))


@_op("BroadcastInDim")
def _broadcast_in_dim(ins: tuple[Value, ...], attrs: dict, meta: bool) -> Value:
    x, sizes, dims = ins[0], tuple(attrs["sizes"]), tuple(attrs["dimensions"])
    if len(dims) != x.dim():
        raise RuntimeError(
            f"Size of broadcast_dimensions has to match operand's rank; operand rank: "
            f"{x.dim()}, size of broadcast_dimensions {len(dims)}."
        )
    view = [1] * len(sizes)
    for i, d in enumerate(dims):
        view[d] = x.shape[i]
    return x.reshape(view).expand(sizes)


@_op("Transpose")
def _transpose(ins: tuple[Value, ...], attrs: dict, meta: bool) -> Value:
    return ins[0].permute(tuple(attrs["permutation"]))


@_op("Rev")
def _rev(ins: tuple[Value, ...], attrs: dict, meta: bool) -> Value:
    return torch.flip(ins[0], tuple(attrs["dimensions"]))


@_op("Slice")
def _slice(ins: tuple[Value, ...], attrs: dict, meta: bool) -> Value:
    starts, limits = attrs["start_indices"], attrs["limit_indices"]
    strides = attrs.get("strides") or [1] * len(starts)
    index = tuple(slice(s, e, st) for s, e, st in zip(starts, limits, strides, strict=True))
    return ins[0][index]


@_op("SliceInDim")
def _slice_in_dim(ins: tuple[Value, ...], attrs: dict, meta: bool) -> Value:
    x, dim = ins[0], attrs["dimno"]
    index = [slice(None)] * x.dim()
    index[dim] = slice(attrs["start_index"], attrs["limit_index"], attrs.get("stride") or 1)
    return x[tuple(index)]


@_op("ConcatInDim")
def _concat(ins: tuple[Value, ...], attrs: dict, meta: bool) -> Value:
    return torch.cat(ins, dim=attrs["dimension"])


@_op("Select")
def _select(ins: tuple[Value, ...], attrs: dict, meta: bool) -> Value:
    pred, on_true, on_false = ins
    if pred.dtype != torch.bool:
        raise RuntimeError(
            f"Select's pred operand must have PRED element type; got {shape_text(pred)}."
        )
    return torch.where(pred, on_true, on_false)


@_op("Clamp")
def _clamp(ins: tuple[Value, ...], attrs: dict, meta: bool) -> Value:
    x, low, high = ins  # torch_xla passes (operand, min, max)
    return torch.minimum(torch.maximum(x, low), high)


@_op("Pad")
def _pad(ins: tuple[Value, ...], attrs: dict, meta: bool) -> Value:
    x, value = ins
    config = [tuple(c) for c in attrs["config"]]
    if len(config) != x.dim():
        raise RuntimeError(
            f"The rank of the operand and the padding configuration do not match: "
            f"{shape_text(x)} versus {len(config)} dimensions."
        )
    grown = []
    for n, (low, high, interior) in zip(x.shape, config, strict=True):
        spread = n + max(n - 1, 0) * interior
        grown.append(max(low, 0) + spread + max(high, 0))
    out = value.expand(grown).clone()
    place, crop = [], []
    for n, size, (low, high, interior) in zip(x.shape, grown, config, strict=True):
        start = max(low, 0)
        place.append(slice(start, start + n + max(n - 1, 0) * interior, interior + 1))
        crop.append(slice(max(-low, 0), size - max(-high, 0)))
    out[tuple(place)] = x
    return out[tuple(crop)]


@_op("Dot")
def _dot(ins: tuple[Value, ...], attrs: dict, meta: bool) -> Value:
    a, b = ins
    if a.dtype != b.dtype:
        raise RuntimeError(
            f"Binary op dot with different element types: {shape_text(a)} and {shape_text(b)}."
        )
    if a.dim() > 2 or b.dim() > 2 or a.dim() == 0 or b.dim() == 0:
        raise NotImplementedError("xlasim simulates the builder's Dot on rank 1 and 2 operands")
    return torch.matmul(a, b)


@_op("TriangularSolve")
def _triangular_solve(ins: tuple[Value, ...], attrs: dict, meta: bool) -> Value:
    a, b = ins
    left = attrs.get("left_side")
    lower = bool(attrs.get("lower"))
    transpose = bool(attrs.get("transpose_a"))
    # Only the triangle named by ``lower`` is read; transposing it swaps which one it is.
    tri = torch.tril(a) if lower else torch.triu(a)
    if transpose:
        tri = tri.mT
    return torch.linalg.solve_triangular(
        tri,
        b,
        upper=lower == transpose,
        left=True if left is None else bool(left),
        unitriangular=bool(attrs.get("unit_diagonal")),
    )


@_op("DynamicSlice")
def _dynamic_slice(ins: tuple[Value, ...], attrs: dict, meta: bool) -> Value:
    x, starts = ins[0], ins[1:]
    sizes = tuple(attrs["slice_sizes"])
    if meta:
        return x.new_empty(sizes)
    index = tuple(
        slice(s, s + size)
        for s, size in zip(_clamped_starts(x.shape, sizes, starts), sizes, strict=True)
    )
    return x[index].clone()


@_op("DynamicUpdateSlice")
def _dynamic_update_slice(ins: tuple[Value, ...], attrs: dict, meta: bool) -> Value:
    x, update, starts = ins[0], ins[1], ins[2:]
    if meta:
        return x.clone()
    out = x.clone()
    index = tuple(
        slice(s, s + size)
        for s, size in zip(
            _clamped_starts(x.shape, update.shape, starts), update.shape, strict=True
        )
    )
    out[index] = update
    return out


def _clamped_starts(shape: Sequence[int], sizes: Sequence[int], starts: Sequence[Any]) -> list[int]:
    # XLA clamps each start so the window stays inside the operand.
    return [
        min(max(int(s.item()), 0), n - size)
        for s, n, size in zip(starts, shape, sizes, strict=True)
    ]


@_op("GetDimensionSize")
def _get_dimension_size(ins: tuple[Value, ...], attrs: dict, meta: bool) -> Value:
    x = ins[0]
    return torch.tensor(x.shape[attrs["dimension"]], dtype=torch.int32, device=x.device)


@_op("Call")
def _call(ins: tuple[Value, ...], attrs: dict, meta: bool) -> Value:
    return evaluate(attrs["computation"], ins, meta)


def _fold(
    x: torch.Tensor, init: torch.Tensor, computation: XlaComputation, dims: list[int], meta: bool
) -> Value:
    keep = [d for d in range(x.dim()) if d not in dims]
    out_shape = [x.shape[d] for d in keep]
    if meta:
        return init.expand(out_shape).clone()
    # The reduced dimensions go last and flat; the computation then folds one slice at a time
    # (it is elementwise on scalars, so it runs on whole slices at once).
    moved = x.permute(keep + list(dims)).reshape(out_shape + [-1])
    acc = init.expand(out_shape).clone()
    for k in range(moved.shape[-1]):
        acc = evaluate(computation, (acc, moved[..., k].contiguous()), exact=False)
    return acc


@_op("Reduce")
def _reduce(ins: tuple[Value, ...], attrs: dict, meta: bool) -> Value:
    x, init = ins
    return _fold(x, init, attrs["computation"], sorted(attrs["dimensions"]), meta)


@_op("ReduceAll")
def _reduce_all(ins: tuple[Value, ...], attrs: dict, meta: bool) -> Value:
    x, init = ins
    return _fold(x, init, attrs["computation"], list(range(x.dim())), meta)


def _predicate(value: Value, what: str) -> bool:
    if not isinstance(value, torch.Tensor) or value.dtype != torch.bool or value.dim() != 0:
        raise RuntimeError(f"{what} must be a PRED scalar, got {shape_text(value)}")
    if value.is_meta:
        raise NotImplementedError(
            f"xlasim cannot take a builder computation's {what} on shapes only (dry run)"
        )
    return bool(value.item())


@_op("Conditional")
def _conditional(ins: tuple[Value, ...], attrs: dict, meta: bool) -> Value:
    pred, on_true, on_false = ins
    if meta:
        return evaluate(attrs["true_computation"], (on_true,), True)
    if _predicate(pred, "Conditional's predicate"):
        return evaluate(attrs["true_computation"], (on_true,))
    return evaluate(attrs["false_computation"], (on_false,))


@_op("While")
def _while(ins: tuple[Value, ...], attrs: dict, meta: bool) -> Value:
    state = ins[0]
    if meta:
        return state
    condition, body = attrs["condition_computation"], attrs["body_computation"]
    while _predicate(evaluate(condition, (state,)), "While's condition"):
        state = evaluate(body, (state,))
    return state
