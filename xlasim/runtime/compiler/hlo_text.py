"""``_get_xla_tensors_hlo``: the HLO module torch_xla 2.9 lowers the given tensors' IR into.

Measured on torch_xla 2.9, and reproduced here for the ops in ``SUPPORTED``:

- torch_xla walks the IR from each tensor's value in turn, depth first, an op's operands
  last to first (a stack), and lowers each IR node when its operands are done. Lowering a
  node creates its HLO instructions; their ids count up from 1 in creation order across the
  module (sub-computations included), so constants of the IR can get lower ids than
  parameters. Tensors held as plain data (no IR value) are left out; none left gives "".
- Device data lowers to one ``parameter`` per buffer, numbered in lowering order, with its
  sharding under SPMD. A Python scalar operand is an IR value too: 0 and +-1 are
  ``constant`` instructions (one per use); any other value is ``f32[]`` device data, one
  parameter per distinct value (torch_xla caches scalar data).
- ``add``/``sub`` multiply the other operand by ``alpha`` first; a binary op broadcasts a
  rank-0 operand to the other's shape (``dimensions={}``).
- An op with several outputs (max over a dim, an optimization barrier) is one IR node: it is
  lowered whole, whichever outputs are asked for, and what nothing uses stays in the text.
- The text lists sub-computations first, then the entry computation in HLO post-order:
  from each instruction no other uses, in id order (dead constants included, then the ROOT
  tuple), operands before users.

Any other op, dtype or layout raises NotImplementedError naming it instead of inventing text.
"""

from __future__ import annotations

from typing import Any

import torch

from xlasim.runtime import custom_ops
from xlasim.runtime import graph as _graph
from xlasim.runtime.debug_info import holds_data_ir
from xlasim.runtime.errors import xla_type
from xlasim.runtime.graph import CustomCall, ManualCollective, Node
from xlasim.runtime.scan_loop import ScanLoop
from xlasim.runtime.state import SimRuntime, active
from xlasim.runtime.tensor import leaf_input

aten = torch.ops.aten

_ADD = {aten.add.Tensor: "add", aten.add_.Tensor: "add"}
_SUB = {aten.sub.Tensor: "subtract", aten.sub_.Tensor: "subtract"}
_BINARY = {
    aten.mul.Tensor: "multiply",
    aten.mul_.Tensor: "multiply",
    aten.div.Tensor: "divide",
    aten.div_.Tensor: "divide",
}
_SUM = {aten.sum.default, aten.sum.dim_IntList}
_MEAN = {aten.mean.default, aten.mean.dim}
_TRANSPOSE = {aten.t.default, aten.transpose.int, aten.permute.default}
_RESHAPE = {aten.view.default, aten._unsafe_view.default, aten.reshape.default}
_SQUEEZE = {aten.squeeze.dim, aten.squeeze.dims, aten.unsqueeze.default}
_IDENTITY = {aten.clone.default}
# One XLA instruction each, keeping the operand's shape and layout.
_UNARY = {
    aten.sin.default: "sine",
    aten.cos.default: "cosine",
    aten.exp.default: "exponential",
    aten.log.default: "log",
    aten.tanh.default: "tanh",
    aten.neg.default: "negate",
    aten.abs.default: "abs",
    aten.sqrt.default: "sqrt",
    aten.rsqrt.default: "rsqrt",
    aten.sigmoid.default: "logistic",
}
_BARRIER = "xla::optimization_barrier"
# torch_xla's own op, registered by custom_ops.
_EINSUM_LINEAR = custom_ops.einsum_linear_forward._opoverload
_MULTI_OUTPUT = {aten.max.dim, _BARRIER}
# Ops whose IR operands are just their tensor inputs.
_TENSOR_OPERANDS = frozenset(
    {*_SUM, *_MEAN, *_TRANSPOSE, *_RESHAPE, *_SQUEEZE, *_IDENTITY, *_UNARY, aten.relu.default}
    | {aten.mm.default, aten.expand.default, aten.select.int, aten.stack.default, _EINSUM_LINEAR}
    | _MULTI_OUTPUT
)

# Ops that only move or copy elements: their lowering does not depend on the dtype.
_MOVES_ELEMENTS = frozenset(
    {*_TRANSPOSE, *_RESHAPE, *_SQUEEZE, *_IDENTITY, aten.select.int, aten.stack.default}
)

SUPPORTED = (
    "device data and Python scalars, add/sub/rsub (with alpha), mul, div, mm, t, transpose, "
    "addmm (a Linear layer), einsum_linear_forward without bias, permute, view/reshape, "
    "squeeze/unsqueeze, expand, select, stack, "
    "sum and mean (all or some dims), max over a dim, relu, sin, cos, exp, log, tanh, neg, "
    "abs, sqrt, rsqrt, sigmoid, clone, optimization barriers, ones_like of a scalar "
    "(autograd's seed), torch_xla's custom-sharding nodes (mark_sharding of a pending value, "
    "annotate_custom_sharding, in-place updates of sharded tensors, "
    "_spmd_full_to_shard_shape, _spmd_shard_to_full_shape), the SPMD all-reduce and "
    "reduce-scatter of a manual region (summing), and scan's loop (a step of these ops on "
    "its carry and xs only), on float32 tensors (mm, and the ops that only move elements, on "
    "tensors of any one dtype)"
)


def _unsupported(what: str) -> NotImplementedError:
    return NotImplementedError(
        f"xlasim does not simulate the HLO text of pending ops like {what}: torch_xla's "
        f"lowering of it is not reproduced (written: {SUPPORTED}) "
        "(torch_xla._XLAC._get_xla_tensors_hlo)"
    )


def _dot_attributes() -> str:
    """A 2-D dot's attributes; torch_xla adds the mat-mul precision, read when it lowers the
    graph, unless it is the default."""
    attributes = ", lhs_contracting_dims={1}, rhs_contracting_dims={0}"
    runtime = active()
    level = runtime.mat_mul_precision if runtime is not None else "default"
    if level != "default":
        attributes += f", operand_precision={{{level},{level}}}"
    return attributes


class _Scalar:
    """A Python scalar operand as an IR value."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _special(v: Any) -> bool:
    return v == 0 or abs(v) == 1


def _number(v: Any) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


class _Instr:
    __slots__ = (
        "id",
        "name",
        "dtype",
        "dims",
        "m2m",
        "body",
        "operands",
        "tuple_shape",
        "tuple_bare",
    )

    def __init__(self, id_, name, dtype, dims, m2m, body, operands) -> None:
        self.id = id_
        self.name = name
        self.dtype = dtype
        self.dims = dims
        self.m2m = m2m
        self.body = body
        self.operands = operands
        self.tuple_shape: str | None = None
        self.tuple_bare: str | None = None

    @property
    def ref(self) -> str:
        return f"%{self.name}.{self.id}"

    def bare(self) -> str:
        if self.tuple_bare is not None:
            return self.tuple_bare
        return f"{self.dtype}[{','.join(map(str, self.dims))}]"

    def full(self) -> str:
        if self.tuple_shape is not None:
            return self.tuple_shape
        layout = "{" + ",".join(map(str, self.m2m)) + "}" if self.dims else ""
        return self.bare() + layout


def _listed(parts: list[str]) -> str:
    """XLA's list of tuple elements or operands: every fifth one marked with its index."""
    return ", ".join(f"/*index={i}*/{p}" if i and not i % 5 else p for i, p in enumerate(parts))


def _ints(values: Any) -> str:
    return ",".join(map(str, values))


def _default(rank: int) -> tuple[int, ...]:
    return tuple(reversed(range(rank)))


class _Builder:
    """Creates instructions with ids in creation order, as XLA's builder does."""

    def __init__(self, rt: SimRuntime) -> None:
        self.rt = rt
        self.next_id = 1
        self.instrs: list[_Instr] = []
        self.params: list[_Instr] = []
        self.subcomputations: list[str] = []
        self.channels = 0  # the collectives' channel ids so far

    def take_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def add(self, name, dtype, dims, body, operands=(), m2m=None, attrs="") -> _Instr:
        dims = tuple(dims)
        m2m = _default(len(dims)) if m2m is None else tuple(m2m)
        instr = _Instr(self.take_id(), name, dtype, dims, m2m, None, list(operands))
        ops = _listed([f"{o.full()} {o.ref}" for o in operands])
        instr.body = body if body is not None else f"{name}({ops}){attrs}"
        self.instrs.append(instr)
        return instr

    def op(self, name, dims, operands, attrs="", m2m=None) -> _Instr:
        return self.add(name, operands[0].dtype, dims, None, operands, m2m, attrs)

    def parameter(self, dtype: str, dims: tuple[int, ...], spec: str) -> _Instr:
        index = len(self.params)
        sharding = f", sharding={spec or '{replicated}'}" if self.rt.spmd else ""
        p = self.add(f"p{index}", dtype, dims, f"parameter({index}){sharding}")
        self.params.append(p)
        return p

    def tupled(self, instr: _Instr, parts: list[_Instr]) -> _Instr:
        """Gives ``instr`` the tuple shape of ``parts``."""
        instr.tuple_shape = "(" + _listed([p.full() for p in parts]) + ")"
        instr.tuple_bare = "(" + _listed([p.bare() for p in parts]) + ")"
        return instr

    def tuple_of(self, parts: list[_Instr]) -> _Instr:
        return self.tupled(self.add("tuple", "", (), None, parts), parts)

    def element(self, whole: _Instr, index: int, part: _Instr) -> _Instr:
        """Element ``index`` of tuple ``whole``, shaped as ``part``."""
        return self.add(
            "get-tuple-element",
            part.dtype,
            part.dims,
            f"get-tuple-element({whole.full()} {whole.ref}), index={index}",
            [whole],
            m2m=part.m2m,
        )

    def zero_index(self) -> _Instr:
        """xla_builder's ``zeros_like`` of an s64 index: a constant broadcast to rank 0."""
        return self.broadcast(self.add("constant", "s64", (), "constant(0)"), ())

    def constant(self, dtype: str, value: Any) -> _Instr:
        return self.add("constant", dtype, (), f"constant({_number(value)})")

    def broadcast(self, x: _Instr, dims: Any, mapped: Any = ()) -> _Instr:
        """``x``'s dimensions become ``mapped`` of the result (XLA's InDimBroadcast)."""
        return self.op("broadcast", dims, [x], ", dimensions={" + _ints(mapped) + "}")

    def reshape(self, x: _Instr, dims: Any) -> _Instr:
        return self.op("reshape", dims, [x])

    def broadcast_in_dim(self, x: _Instr, dims: tuple[int, ...], mapped: list[int]) -> _Instr:
        """XLA builder's BroadcastInDim: a broadcast keeping ``x``'s sizes, then, where a
        size-1 dimension grows, a reshape dropping the growing dims and a second broadcast."""
        in_dims = list(dims)
        for i, d in enumerate(mapped):
            in_dims[d] = x.dims[i]
        y = self.broadcast(x, in_dims, mapped)
        if tuple(in_dims) == tuple(dims):
            return y
        keep = [i for i, n in enumerate(in_dims) if n == dims[i]]
        return self.broadcast(self.reshape(y, [in_dims[i] for i in keep]), dims, keep)

    def expand(self, x: _Instr, sizes: tuple[int, ...]) -> _Instr:
        """torch_xla's expand: a reshape to the output rank (when it differs), then a
        BroadcastInDim over every dimension."""
        _default_layout(x, "expand")
        lead = len(sizes) - len(x.dims)
        in_sizes = (1,) * lead + x.dims
        if in_sizes != x.dims:
            x = self.reshape(x, in_sizes)
        return self.broadcast_in_dim(x, sizes, list(range(len(sizes))))

    def max_computation(self) -> str:
        cid, xid, yid, mid = (self.take_id() for _ in range(4))
        name = f"MaxComputation.{cid}"
        self.subcomputations.append(
            f"%{name} (x.{xid}: f32[], y.{yid}: f32[]) -> f32[] {{\n"
            f"  %x.{xid} = f32[] parameter(0)\n"
            f"  %y.{yid} = f32[] parameter(1)\n"
            f"  ROOT %maximum.{mid} = f32[] maximum(f32[] %x.{xid}, f32[] %y.{yid})\n"
            "}\n"
        )
        return name

    def minmax_function(self) -> str:
        """The (value, index) reducer of max over a dim; torch_xla's builder spends 12 ids on
        instructions that do not reach the module just before it."""
        for _ in range(12):
            self.take_id()
        c, lv, li, rv, ri, ge, sv, si, eq, mn, sf, tp = (self.take_id() for _ in range(12))
        name = f"minmax_func.{c}"
        self.subcomputations.append(
            f"%{name} (lhs_value.{lv}: f32[], lhs_index.{li}: s32[], rhs_value.{rv}: f32[], "
            f"rhs_index.{ri}: s32[]) -> (f32[], s32[]) {{\n"
            f"  %lhs_value.{lv} = f32[] parameter(0)\n"
            f"  %rhs_value.{rv} = f32[] parameter(2)\n"
            f"  %compare.{ge} = pred[] compare(f32[] %lhs_value.{lv}, f32[] %rhs_value.{rv}), "
            "direction=GE\n"
            f"  %select.{sv} = f32[] select(pred[] %compare.{ge}, f32[] %lhs_value.{lv}, "
            f"f32[] %rhs_value.{rv})\n"
            f"  %compare.{eq} = pred[] compare(f32[] %lhs_value.{lv}, f32[] %rhs_value.{rv}), "
            "direction=EQ\n"
            f"  %lhs_index.{li} = s32[] parameter(1)\n"
            f"  %rhs_index.{ri} = s32[] parameter(3)\n"
            f"  %minimum.{mn} = s32[] minimum(s32[] %lhs_index.{li}, s32[] %rhs_index.{ri})\n"
            f"  %select.{si} = s32[] select(pred[] %compare.{ge}, s32[] %lhs_index.{li}, "
            f"s32[] %rhs_index.{ri})\n"
            f"  %select.{sf} = s32[] select(pred[] %compare.{eq}, s32[] %minimum.{mn}, "
            f"s32[] %select.{si})\n"
            f"  ROOT %tuple.{tp} = (f32[], s32[]) tuple(f32[] %select.{sv}, s32[] %select.{sf})\n"
            "}\n"
        )
        return name

    def add_computation(self, dtype: str) -> str:
        cid, xid, yid, aid = (self.take_id() for _ in range(4))
        name = f"AddComputation.{cid}"
        self.subcomputations.append(
            f"%{name} (x.{xid}: {dtype}[], y.{yid}: {dtype}[]) -> {dtype}[] {{\n"
            f"  %x.{xid} = {dtype}[] parameter(0)\n"
            f"  %y.{yid} = {dtype}[] parameter(1)\n"
            f"  ROOT %add.{aid} = {dtype}[] add({dtype}[] %x.{xid}, {dtype}[] %y.{yid})\n"
            "}\n"
        )
        return name


def _default_layout(x: _Instr, what: str) -> None:
    if x.m2m != _default(len(x.dims)):
        raise _unsupported(f"{what} of a value with layout {x.full()} (a transpose's result)")


def _binary(b: _Builder, name: str, lhs: _Instr, rhs: _Instr) -> _Instr:
    """XLA's elementwise op: a rank-0 operand is broadcast to the other's shape and the
    result has the default layout; operands of one shape give the left one's layout."""
    if lhs.dims == rhs.dims:
        return b.op(name, lhs.dims, [lhs, rhs], m2m=lhs.m2m)
    if not rhs.dims:
        rhs = b.broadcast(rhs, lhs.dims)
    elif not lhs.dims:
        lhs = b.broadcast(lhs, rhs.dims)
    else:
        raise _unsupported(f"{name} broadcasting {lhs.bare()} with {rhs.bare()}")
    return b.op(name, lhs.dims, [lhs, rhs])


def _node_args(node: Node) -> tuple[list[Any], dict[str, Any]]:
    if node.args is None or isinstance(node.args, CustomCall):
        raise _unsupported(f"{node.op} (its arguments were not recorded)")
    return node.args[0], node.args[1] or {}


def _output_index(node: Node) -> int:
    """Which output of its op ``node`` is (ops with several record it third in ``args``)."""
    args = node.args
    return args[2] if type(args) is tuple and len(args) > 2 else 0


class _Counter:
    """scan's iteration counter, ``torch.tensor(0)``: an s64 constant IR value."""

    __slots__ = ()


class _Zeros:
    """A ys buffer of scan, ``torch.zeros((length, *y.shape))``: a constant 0 expanded."""

    __slots__ = ("dims", "dtype")

    def __init__(self, dims: tuple[int, ...], dtype: str) -> None:
        self.dims = dims
        self.dtype = dtype


class _StepInput:
    """Input ``index`` of scan's step inside its computation: the parameter times 1, as
    torch_xla multiplies each input of the traced step so that none is device data."""

    __slots__ = ("index", "param")

    def __init__(self, index: int) -> None:
        self.index = index
        self.param = _StepParam(index)


class _StepParam:
    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


class _Lowering:
    def __init__(self, rt: SimRuntime) -> None:
        self.b = _Builder(rt)
        self.operands: dict[int, list[Any]] = {}
        self.values: dict[int, _Instr] = {}
        self.scalars: dict[float, _Scalar] = {}
        # The outputs of one multi-output op are one IR node: its first node seen stands for it.
        self.canonical: dict[int, Node] = {}
        # Lowering scan's step: its inputs' IR values -> what stands for them, their types,
        # and the input of each parameter in parameter order.
        self.step: dict[int, _StepInput] | None = None
        self.step_types: list[tuple[tuple[int, ...], str]] = []
        self.param_inputs: list[int] = []

    def canon(self, item: Any) -> Any:
        if self.step is not None:
            found = self.step.get(id(item))
            if found is not None:
                return found
        if isinstance(item, Node):
            if item.loop is not None:  # the outputs of scan's loop are one IR node
                return item.loop[0]
            if item.op in _MULTI_OUTPUT and item.args is not None:
                return self.canonical.setdefault(id(item.args[0]), item)
        return item

    def value(self, item: Any) -> _Instr:
        canon = self.canon(item)
        found = self.values[id(canon)]
        if not isinstance(found, list):
            return found
        return found[item.loop[1] if isinstance(canon, ScanLoop) else _output_index(item)]

    def scalar(self, v: Any) -> _Scalar:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise _unsupported(f"a scalar operand {v!r}")
        if _special(v):
            return _Scalar(v)  # a constant per use
        return self.scalars.setdefault(float(v), _Scalar(v))

    def ir_operands(self, item: Any) -> list[Any]:
        """The IR operands of ``item`` in torch_xla's order (computed once per item)."""
        key = id(item)
        found = self.operands.get(key)
        if found is not None:
            return found
        ops: list[Any] = []
        if isinstance(item, ScanLoop):
            n_carry = len(item.init)
            ops = [_Counter(), *(v for v, _ in item.init), *(v for v, _ in item.xs)]
            for _, (dims, dtype) in item.step_outputs[n_carry:]:
                ops.append(_Zeros((item.length, *dims), dtype))
        elif isinstance(item, _StepInput):
            ops = [item.param, self.scalar(1)]
        elif isinstance(item, Node):
            op = item.op
            if isinstance(item.args, (CustomCall, ManualCollective)) or op in _TENSOR_OPERANDS:
                ops = list(item.inputs)
            elif op is aten.addmm.default:  # torch_xla's node takes the bias last
                ops = [item.inputs[1], item.inputs[2], item.inputs[0]]
            elif op is aten.ones_like.default:
                ops = []  # torch_xla makes a constant of the input's shape: no operand
            elif op in _ADD or op in _SUB or op is aten.rsub.Scalar:
                consts, kwargs = _node_args(item)
                other = item.inputs[1] if len(item.inputs) > 1 else self.scalar(consts[0])
                ops = [item.inputs[0], other, self.scalar(kwargs.get("alpha", 1))]
            elif op in _BINARY:
                consts, _ = _node_args(item)
                other = item.inputs[1] if len(item.inputs) > 1 else self.scalar(consts[0])
                ops = [item.inputs[0], other]
            else:
                raise _unsupported(str(op))
        self.operands[key] = ops
        return ops

    def post_order(self, roots: list[Any]) -> list[Any]:
        """torch_xla's walk: a stack, so an op's last operand is lowered first."""
        emitted: dict[int, bool] = {}  # False while its operands are being visited
        order: list[Any] = []
        for root in roots:
            stack = [self.canon(root)]
            while stack:
                item = stack[-1]
                state = emitted.get(id(item))
                if state is None:
                    emitted[id(item)] = False
                    for o in self.ir_operands(item):
                        o = self.canon(o)
                        if id(o) not in emitted:
                            stack.append(o)
                elif state is False:
                    emitted[id(item)] = True
                    order.append(item)
                    stack.pop()
                else:
                    stack.pop()
        return order

    def lower(self, item: Any, dtype: str) -> Any:
        """The instruction of ``item``'s value (a list of them for a multi-output op)."""
        b = self.b
        in_step = self.step is not None
        if isinstance(item, _Scalar):
            if _special(item.value):
                return b.constant(dtype, item.value)
            if in_step:
                raise _unsupported("a scan step using a Python number (a hoisted parameter)")
            return b.parameter(dtype, (), "")
        if isinstance(item, tuple):  # device data: (shape, dtype, sharding text)
            if in_step:
                raise _unsupported("a scan step reading tensors other than its carry and xs")
            return b.parameter(xla_type(item[1]), tuple(item[0]), item[2])
        if isinstance(item, _Counter):
            return b.add("constant", "s64", (), "constant(0)")
        if isinstance(item, _Zeros):
            return b.expand(b.constant(item.dtype, 0), item.dims)
        if isinstance(item, _StepParam):
            dims, param_dtype = self.step_types[item.index]
            index = len(b.params)
            param = b.add(f"p{index}", param_dtype, dims, f"parameter({index})")
            b.params.append(param)
            self.param_inputs.append(item.index)
            return param
        ins = [self.value(o) for o in self.ir_operands(item)]
        if isinstance(item, _StepInput):
            return _binary(b, "multiply", ins[0], ins[1])
        if isinstance(item, ScanLoop):
            return self.loop(item, ins)
        op, call = item.op, item.args
        # A 2-D dot of two tensors of one dtype lowers alike for every dtype (measured for
        # float8 and bfloat16), as do the ops that only move elements (measured for s8, bf16
        # and s32); the other ops only on float32.
        same_dtype_mm = op is aten.mm.default and len({x.dtype for x in ins}) == 1
        moves_only = op in _MOVES_ELEMENTS and len({x.dtype for x in ins}) == 1
        for x in ins:
            if x.dtype != "f32" and not (same_dtype_mm or moves_only):
                raise _unsupported(f"{op} on {x.dtype} tensors")
        if isinstance(call, CustomCall):
            x = ins[0]
            if tuple(call.shape) != x.dims:
                _default_layout(x, f"custom-call {call.target}")
            text = call.spec_text()
            spec = f", sharding={text}" if text is not None else ""
            return b.op(
                "custom-call",
                call.shape,
                [x],
                f', custom_call_target="{call.target}"{spec}',
                m2m=x.m2m if tuple(call.shape) == x.dims else None,
            )
        if isinstance(call, ManualCollective):
            return self.collective(call, ins[0])
        if op is aten.ones_like.default:
            return self.ones_like(item, dtype)
        if op is aten.max.dim:
            return self.max_dim(item, ins[0])
        if op == _BARRIER:
            return self.barrier(ins)
        if op is aten.addmm.default:
            return self.addmm(item, *ins)
        if op is _EINSUM_LINEAR:
            return self.einsum_linear(*ins)
        if op is aten.rsub.Scalar:  # other - self * alpha
            scaled = _binary(b, "multiply", ins[0], ins[2])
            return _binary(b, "subtract", ins[1], scaled)
        if op in _ADD or op in _SUB:
            scaled = _binary(b, "multiply", ins[1], ins[2])
            return _binary(b, "add" if op in _ADD else "subtract", ins[0], scaled)
        if op in _BINARY:
            return _binary(b, _BINARY[op], ins[0], ins[1])
        if op in _IDENTITY:
            return ins[0]
        if op in _UNARY:
            x = ins[0]
            return b.op(_UNARY[op], x.dims, [x], m2m=x.m2m)
        if op is aten.relu.default:
            x = ins[0]
            zero = b.constant(x.dtype, 0)
            return b.op("maximum", x.dims, [x, b.broadcast(zero, x.dims)])
        if op is aten.mm.default:
            lhs, rhs = ins
            return b.op(
                "dot",
                (lhs.dims[0], rhs.dims[1]),
                [lhs, rhs],
                _dot_attributes(),
            )
        consts, kwargs = _node_args(item)
        x = ins[0]
        rank = len(x.dims)
        if op in _TRANSPOSE:
            perm = _permutation(op, consts, rank)
            inverse = [0] * rank
            for i, p in enumerate(perm):
                inverse[p] = i
            return b.op(
                "transpose",
                tuple(x.dims[p] for p in perm),
                [x],
                ", dimensions={" + ",".join(map(str, perm)) + "}",
                m2m=[inverse[k] for k in x.m2m],
            )
        if op in _SQUEEZE:
            dims = tuple(item.shape)
            return x if dims == x.dims else b.op("reshape", dims, [x])
        if op in _RESHAPE:
            dims = _view_shape(consts[0], x.dims)
            if dims == x.dims:
                return x  # torch_xla's reshape to the same sizes makes no instruction
            return b.op("reshape", dims, [x])
        if op in _SUM:
            return self.sum(item, x, consts, kwargs)
        if op in _MEAN:
            return self.mean(item, x, consts, kwargs)
        if op is aten.select.int:
            return self.select(x, consts[0] % rank, consts[1])
        if op is aten.stack.default:
            given = consts[1] if len(consts) > 1 else kwargs.get("dim", 0)
            return self.stack(ins, given % (rank + 1))
        if op is aten.expand.default:
            sizes = tuple(
                x.dims[i - len(consts[0]) + rank] if n == -1 else n for i, n in enumerate(consts[0])
            )
            if sizes == x.dims or kwargs.get("implicit"):
                raise _unsupported(f"{op} to the same shape or implicit")
            return b.expand(x, sizes)
        raise _unsupported(str(op))

    def loop(self, loop: ScanLoop, state: list[_Instr]) -> list[_Instr]:
        """torch_xla's ``xla::scan``: a call of a computation whose while loop threads
        (iteration, carry..., xs..., ys...), each step slicing the xs at the iteration,
        calling the step's computation and writing its ys into their buffers."""
        b = self.b
        if self.step is not None or b.rt.spmd:
            raise _unsupported("scan inside a scanned function or under SPMD")
        for x in state:
            _default_layout(x, "scan")
        n_carry, n_xs = len(loop.init), len(loop.xs)
        step, params, outs = self.step_computation(loop)
        bare = "(" + _listed([x.bare() for x in state]) + ")"

        def state_param() -> _Instr:
            return b.tupled(b.add("p0", "", (), "parameter(0)"), state)

        body = f"Body.{b.take_id()}"
        outer, b.instrs = b.instrs, []
        whole = state_param()
        parts = [b.element(whole, i, x) for i, x in enumerate(state)]
        step_index = parts[0]
        slices = []
        for xs in parts[1 + n_carry : 1 + n_carry + n_xs]:
            indices = [step_index, *(b.zero_index() for _ in xs.dims[1:])]
            sizes = (1, *xs.dims[1:])
            window = b.add(
                "dynamic-slice",
                xs.dtype,
                sizes,
                None,
                [xs, *indices],
                attrs=f", dynamic_slice_sizes={{{_ints(sizes)}}}",
            )
            slices.append(b.reshape(window, xs.dims[1:]))
        args = [parts[1 + k] if k < n_carry else slices[k - n_carry] for k in params]
        call = b.tupled(b.add("call", "", (), None, args, attrs=f", to_apply=%{step}"), outs)
        carry = [b.element(call, i, outs[i]) for i in range(n_carry)]
        ys = []
        for i, buffer in enumerate(parts[1 + n_carry + n_xs :]):
            y = b.element(call, n_carry + i, outs[n_carry + i])
            grown = b.broadcast(y, (1, *y.dims), range(1, len(y.dims) + 1))
            indices = [step_index, *(b.zero_index() for _ in y.dims)]
            ys.append(
                b.add(
                    "dynamic-update-slice",
                    buffer.dtype,
                    buffer.dims,
                    None,
                    [buffer, grown, *indices],
                )
            )
        following = b.op("add", (), [step_index, b.add("constant", "s64", (), "constant(1)")])
        root = b.tuple_of([following, *carry, *parts[1 + n_carry : 1 + n_carry + n_xs], *ys])
        b.subcomputations.append(_computation(body, [whole], bare, b.instrs, root))

        condition = f"Condition.{b.take_id()}"
        b.instrs = []
        whole = state_param()
        parts = [b.element(whole, i, x) for i, x in enumerate(state)]
        limit = b.add("constant", "s64", (), f"constant({loop.length})")
        below = b.add("compare", "pred", (), None, [parts[0], limit], attrs=", direction=LT")
        b.subcomputations.append(_computation(condition, [whole], "pred[]", b.instrs, below))

        scan = f"scan.{b.take_id()}"
        b.instrs = []
        inputs = [b.add(f"p{i}", x.dtype, x.dims, f"parameter({i})") for i, x in enumerate(state)]
        attrs = f", condition=%{condition}, body=%{body}"
        repeat = b.tupled(b.add("while", "", (), None, [b.tuple_of(inputs)], attrs=attrs), state)
        b.subcomputations.append(_computation(scan, inputs, bare, b.instrs, repeat))

        b.instrs = outer
        result = b.tupled(b.add("call", "", (), None, state, attrs=f", to_apply=%{scan}"), state)
        return [b.element(result, i, x) for i, x in enumerate(state)]

    def step_computation(self, loop: ScanLoop) -> tuple[str, list[int], list[_Instr]]:
        """The step's computation (torch_xla lowers the traced step on its own and imports
        it, so its ids follow on): its name, the step input of each parameter, its outputs."""
        b = self.b
        name = f"FnComputation.{b.take_id()}"
        sub = _Lowering(b.rt)
        sub.b.next_id = b.next_id
        sub.step = {}
        for k, (item, (dims, dtype)) in enumerate(loop.step_inputs):
            if dtype != "f32" or id(item) in sub.step:
                raise _unsupported("scan of non-float32 or repeated carry or xs tensors")
            sub.step[id(item)] = _StepInput(k)
            sub.step_types.append((dims, dtype))
        items = [item for item, _ in loop.step_outputs]
        for item in sub.post_order(items):
            sub.values[id(item)] = sub.lower(item, "f32")
        outs = [sub.value(item) for item in items]
        if sub.b.subcomputations:
            raise _unsupported("a scan step whose ops have computations of their own")
        root = sub.b.tuple_of(outs)
        b.next_id = sub.b.next_id
        result = "(" + _listed([o.bare() for o in outs]) + ")"
        b.subcomputations.append(_computation(name, sub.b.params, result, sub.b.instrs, root))
        return name, sub.param_inputs, outs

    def collective(self, call: ManualCollective, x: _Instr) -> _Instr:
        """torch_xla's SPMD all-reduce / reduce-scatter: over global device ids, one channel
        per collective of the graph, the scale a multiply after it."""
        b = self.b
        if call.reduce_type != "sum":
            raise _unsupported(f"{call.kind} reducing by {call.reduce_type!r}")
        _default_layout(x, call.kind)
        to_apply = b.add_computation(x.dtype)
        b.channels += 1
        groups = ",".join("{" + _ints(g) + "}" for g in call.groups)
        attrs = (
            f", channel_id={b.channels}, replica_groups={{{groups}}}, use_global_device_ids=true"
        )
        if call.dim is not None:
            attrs += f", dimensions={{{call.dim}}}"
        out = b.op(call.kind, call.shape, [x], attrs + f", to_apply=%{to_apply}")
        if call.scale == 1.0:
            return out
        scale = b.broadcast(b.constant(x.dtype, call.scale), call.shape)
        return b.op("multiply", call.shape, [out, scale])

    def ones_like(self, node: Node, dtype: str) -> _Instr:
        """torch_xla's ``full``: a constant expanded to the shape, measured for a rank-0
        input (autograd's seed gradient of a scalar loss)."""
        consts, kwargs = _node_args(node)
        if set(kwargs) - {"pin_memory", "memory_format"} or consts:
            raise _unsupported(f"{node.op} with dtype, layout or device arguments")
        # The input's shape: what lowering it on a builder of its own gives.
        shape = _Lowering(self.b.rt)
        source = None
        for item in shape.post_order([node.inputs[0]]):
            shape.values[id(item)] = shape.lower(item, "f32")
        source = shape.value(node.inputs[0])
        if source.dims:
            raise _unsupported(f"{node.op} of a tensor of rank {len(source.dims)}")
        return self.b.expand(self.b.constant(source.dtype, 1), source.dims)

    def barrier(self, ins: list[_Instr]) -> list[_Instr]:
        """The values as one tuple through an ``opt-barrier``, then taken out again."""
        b = self.b
        shape = "(" + ", ".join(x.full() for x in ins) + ")"
        together = b.add("tuple", "", (), None, ins)
        together.tuple_shape = shape
        barrier = b.add("opt-barrier", "", (), None, [together])
        barrier.tuple_shape = shape
        return [
            b.add(
                "get-tuple-element",
                x.dtype,
                x.dims,
                f"get-tuple-element({shape} {barrier.ref}), index={i}",
                [barrier],
                m2m=x.m2m,
            )
            for i, x in enumerate(ins)
        ]

    def einsum_linear(self, x: _Instr, *weight_and_bias: _Instr) -> _Instr:
        """torch_xla's einsum ``...n,mn->...m``: a dot contracting the last dims, marked as
        needing no gradient, then the einsum's (here identity) transpose."""
        b = self.b
        if len(weight_and_bias) != 1 or len(x.dims) < 2:
            raise _unsupported(f"{_EINSUM_LINEAR} with a bias or of a rank-{len(x.dims)} input")
        (weight,) = weight_and_bias
        for operand in (x, weight):
            _default_layout(operand, str(_EINSUM_LINEAR))
        rank = len(x.dims)
        dot = b.op(
            "dot",
            (*x.dims[:-1], weight.dims[0]),
            [x, weight],
            f", lhs_contracting_dims={{{rank - 1}}}, rhs_contracting_dims={{1}}, "
            'frontend_attributes={grad_x="false",grad_y="false"}',
        )
        return b.op("transpose", dot.dims, [dot], f", dimensions={{{_ints(range(rank))}}}")

    def addmm(self, node: Node, mat1: _Instr, mat2: _Instr, bias: _Instr) -> _Instr:
        """A dot, then the bias expanded to its shape and added (beta and alpha 1)."""
        consts, kwargs = _node_args(node)
        if consts or kwargs.get("beta", 1) != 1 or kwargs.get("alpha", 1) != 1:
            raise _unsupported(f"{node.op} with beta or alpha other than 1")
        if len(bias.dims) != 1:
            raise _unsupported(f"{node.op} with a bias of rank {len(bias.dims)}")
        b = self.b
        out = (mat1.dims[0], mat2.dims[1])
        dot = b.op("dot", out, [mat1, mat2], _dot_attributes())
        return _binary(b, "add", dot, b.expand(bias, out))

    def max_dim(self, node: Node, x: _Instr) -> list[_Instr]:
        """torch_xla's max over a dim: a max reduce for the values, then a reduce of
        (value, iota) pairs keeping the first index of the maximum, converted to s64."""
        b = self.b
        consts, kwargs = _node_args(node)
        _default_layout(x, str(node.op))
        rank = len(x.dims)
        keepdim = bool(consts[1]) if len(consts) > 1 else bool(kwargs.get("keepdim", False))
        if not rank:
            raise _unsupported(f"{node.op} of a rank-0 tensor")
        d = consts[0] % rank
        out = tuple(n for i, n in enumerate(x.dims) if i != d)
        kept = tuple(1 if i == d else n for i, n in enumerate(x.dims))
        lowest = b.add("constant", "f32", (), "constant(-3.40282347e+38)")
        b.constant("s32", x.dims[d])  # torch_xla makes it; nothing uses it
        to_apply = b.max_computation()
        values = b.op("reduce", out, [x, lowest], f", dimensions={{{d}}}, to_apply=%{to_apply}")
        if keepdim:
            values = b.reshape(values, kept)
        minus_inf = b.add("constant", "f32", (), "constant(-inf)")
        zero = b.constant("s32", 0)
        iota = b.add("iota", "s32", x.dims, f"iota(), iota_dimension={d}")
        pair_fn = b.minmax_function()
        pair = b.add(
            "reduce",
            "",
            (),
            None,
            [x, iota, minus_inf, zero],
            attrs=f", dimensions={{{d}}}, to_apply=%{pair_fn}",
        )
        layout = "{" + _ints(_default(len(out))) + "}" if out else ""
        shape = f"[{_ints(out)}]{layout}"
        pair.tuple_shape = f"(f32{shape}, s32{shape})"
        index = b.add(
            "get-tuple-element",
            "s32",
            out,
            f"get-tuple-element({pair.tuple_shape} {pair.ref}), index=1",
            [pair],
        )
        indices = b.op("convert", out, [index])
        indices.dtype = "s64"
        if keepdim:
            indices = b.reshape(indices, kept)
        return [values, indices]

    def sum(self, node: Node, x: _Instr, consts: list[Any], kwargs: dict[str, Any]) -> _Instr:
        dims, keepdim = _reduced_dims(node, x, consts, kwargs)
        reduced, _ = self.reduce_sum(x, dims)
        return self.kept(reduced, x, dims) if keepdim else reduced

    def reduce_sum(self, x: _Instr, dims: list[int]) -> tuple[_Instr, _Instr]:
        """The add-reduce over ``dims`` and the s32 count of the elements it adds, which
        torch_xla makes just after the reduce's initial value (a sum leaves it unused)."""
        b = self.b
        init = b.constant(x.dtype, 0)
        count = 1
        for d in dims:
            count *= x.dims[d]
        elements = b.constant("s32", count)
        to_apply = b.add_computation(x.dtype)
        out = tuple(n for i, n in enumerate(x.dims) if i not in dims)
        reduced = b.add(
            "reduce",
            x.dtype,
            out,
            None,
            [x, init],
            attrs=", dimensions={" + _ints(dims) + "}, to_apply=%" + to_apply,
        )
        return reduced, elements

    def kept(self, reduced: _Instr, x: _Instr, dims: list[int]) -> _Instr:
        """keepdim: the reduced value reshaped to ``x``'s rank, size 1 where it was reduced."""
        return self.b.reshape(reduced, tuple(1 if i in dims else n for i, n in enumerate(x.dims)))

    def mean(self, node: Node, x: _Instr, consts: list[Any], kwargs: dict[str, Any]) -> _Instr:
        """torch_xla's mean: the sum times 1/count (NaN for no elements, chosen by a select),
        then a convert to the result type, even when it is the same."""
        b = self.b
        dims, keepdim = _reduced_dims(node, x, consts, kwargs)
        reduced, count = self.reduce_sum(x, dims)
        zero = b.constant("s32", 0)
        one = b.constant(x.dtype, 1)
        nan = b.add("constant", x.dtype, (), "constant(nan)")
        as_float = b.add("convert", x.dtype, (), None, [count])
        inverse = b.op("divide", (), [one, as_float])
        nonzero = b.add("compare", "pred", (), None, [count, zero], attrs=", direction=NE")
        scale = b.add("select", x.dtype, (), None, [nonzero, inverse, nan])
        mean = _binary(b, "multiply", reduced, scale)
        if keepdim:
            mean = self.kept(mean, x, dims)
        return b.op("convert", mean.dims, [mean])

    def select(self, x: _Instr, dim: int, index: int) -> _Instr:
        """torch_xla's select: a one-wide slice along ``dim``, reshaped without it."""
        size = x.dims[dim]
        if not -size <= index < size:
            raise _unsupported(f"select of index {index} out of a dimension of {size}")
        start = index % size
        bounds = [(start, start + 1) if i == dim else (0, n) for i, n in enumerate(x.dims)]
        sliced = self.b.add(
            "slice",
            x.dtype,
            [stop - begin for begin, stop in bounds],
            None,
            [x],
            attrs=", slice={" + ", ".join(f"[{begin}:{stop}]" for begin, stop in bounds) + "}",
        )
        return self.b.reshape(sliced, [n for i, n in enumerate(x.dims) if i != dim])

    def stack(self, ins: list[_Instr], dim: int) -> _Instr:
        """torch_xla's stack: each input reshaped with a size-1 ``dim``, in order, then one
        concatenate along it (also of a single input)."""
        b = self.b
        dims = ins[0].dims
        if any(x.dims != dims for x in ins):
            raise _unsupported("stack of tensors of different shapes")
        one = (*dims[:dim], 1, *dims[dim:])
        parts = [b.reshape(x, one) for x in ins]
        out = (*dims[:dim], len(ins), *dims[dim:])
        return b.op("concatenate", out, parts, f", dimensions={{{dim}}}")


def _reduced_dims(
    node: Node, x: _Instr, consts: list[Any], kwargs: dict[str, Any]
) -> tuple[list[int], bool]:
    """The sorted dims a sum or mean reduces and its keepdim."""
    rank = len(x.dims)
    if node.op in (aten.sum.default, aten.mean.default):
        dims, keepdim = list(range(rank)), False
    else:
        given = consts[0] if consts else kwargs.get("dim")
        keepdim = bool(consts[1]) if len(consts) > 1 else bool(kwargs.get("keepdim", False))
        if not given:
            raise _unsupported(f"{node.op} over an empty or unnamed dim list")
        dims = sorted({d % rank for d in given})
    if kwargs.get("dtype") is not None or not rank:
        raise _unsupported(f"{node.op} with a dtype or of a rank-0 tensor")
    return dims, keepdim


def _permutation(op: Any, consts: list[Any], rank: int) -> list[int]:
    if op is aten.t.default:
        if rank != 2:
            raise _unsupported(f"{op} of a rank-{rank} tensor")
        return [1, 0]
    if op is aten.transpose.int:
        d0, d1 = consts[0] % rank, consts[1] % rank
        perm = list(range(rank))
        perm[d0], perm[d1] = perm[d1], perm[d0]
    else:
        perm = [d % rank for d in consts[0]]
    if perm == list(range(rank)):
        raise _unsupported(f"{op} that keeps the dimension order")
    return perm


def _view_shape(sizes: Any, dims: tuple[int, ...]) -> tuple[int, ...]:
    numel = 1
    for n in dims:
        numel *= n
    sizes = list(sizes)
    if -1 in sizes:
        known = 1
        for n in sizes:
            if n != -1:
                known *= n
        sizes[sizes.index(-1)] = numel // known if known else 0
    return tuple(sizes)


def _post_order_text(instrs: list[_Instr]) -> list[_Instr]:
    """XLA's post order: from each unused instruction in id order, operands first."""
    used = {id(o) for i in instrs for o in i.operands}
    seen: set[int] = set()
    out: list[_Instr] = []
    for start in instrs:
        if id(start) in used or id(start) in seen:
            continue
        stack: list[tuple[_Instr, int]] = [(start, 0)]
        seen.add(id(start))
        while stack:
            instr, k = stack.pop()
            if k < len(instr.operands):
                stack.append((instr, k + 1))
                o = instr.operands[k]
                if id(o) not in seen:
                    seen.add(id(o))
                    stack.append((o, 0))
            else:
                out.append(instr)
    return out


def _computation(
    name: str, params: list[_Instr], result: str, instrs: list[_Instr], root: _Instr
) -> str:
    """A sub-computation's text, as the module lists it before the entry."""
    signature = ", ".join(f"{p.name}.{p.id}: {p.bare()}" for p in params)
    lines = [f"%{name} ({signature}) -> {result} {{"]
    for instr in _post_order_text(instrs):
        lines.append(
            f"  {'ROOT ' if instr is root else ''}{instr.ref} = {instr.full()} {instr.body}"
        )
    lines.append("}")
    return "\n".join(lines) + "\n"


def tensors_hlo(rt: SimRuntime, tensors: list[Any]) -> str:
    roots: list[Any] = []
    by_buffer: dict[int, Any] = {}
    for t in tensors:
        if t._node is not None:
            if _graph.RECORD_CALLS:
                raise _unsupported("graphs recorded for the TPU compiler (compiler='libtpu')")
            roots.append(t._node)
            continue
        if not holds_data_ir(rt, t):
            continue
        # Aliases of one buffer are one parameter.
        key = id(t._buf) if t._buf is not None else id(t)
        roots.append(by_buffer.setdefault(key, leaf_input(t)))
    if not roots:
        return ""
    low = _Lowering(rt)
    for item in low.post_order(roots):
        low.values[id(item)] = low.lower(item, "f32")  # the scalars of float32 ops
    outs = [low.value(r) for r in roots]
    b = low.b
    tuple_shape = "(" + _listed([o.full() for o in outs]) + ")"
    ops = _listed([f"{o.full()} {o.ref}" for o in outs])
    root = _Instr(b.take_id(), "tuple", "", (), (), f"tuple({ops})", outs)
    b.instrs.append(root)
    module = f"IrToHlo.{b.take_id()}"
    params = b.params
    lines = [
        f"HloModule {module}, entry_computation_layout="
        f"{{({_listed([p.full() for p in params])})->{tuple_shape}}}",
        "",
        *b.subcomputations,
        f"ENTRY %{module} ({', '.join(f'{p.name}.{p.id}: {p.bare()}' for p in params)}) -> "
        f"({_listed([o.bare() for o in outs])}) {{",
    ]
    for instr in _post_order_text(b.instrs):
        if instr is root:
            lines.append(f"  ROOT {root.ref} = {tuple_shape} {root.body}")
        else:
            lines.append(f"  {instr.ref} = {instr.full()} {instr.body}")
    lines.append("}")
    return "\n".join(lines) + "\n\n"
