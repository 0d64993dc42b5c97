"""Simulated ``torch_xla.core.xla_builder``: XLA computations built op by op in Python.

Every op goes through the same ``torch_xla._XLAC._xla_op_*`` functions torch_xla's module uses;
in the simulator they build a Python op graph (``xlasim.runtime.op_builder``) that really
computes when the computation runs on simulated device tensors
(``torch_xla._XLAC._xla_user_computation``, which ``xla_op_registry`` calls).
"""

from __future__ import annotations

import abc
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch_xla
from torch.utils import _pytree as pytree
from torch_xla._internal.jax_workarounds import maybe_get_torchax, requires_jax

from xlasim.runtime import jax_interop
from xlasim.runtime.op_builder import TORCH_TO_XLA, XLA_TO_TORCH


class Type:
    """XLA element type names, as torch_xla spells them."""

    F32 = "f32"
    F64 = "f64"
    BF16 = "bf16"
    F16 = "f16"
    U8 = "u8"
    S8 = "s8"
    U16 = "u16"
    S16 = "s16"
    U32 = "u32"
    S32 = "s32"
    U64 = "u64"
    S64 = "s64"
    C64 = "c64"
    C128 = "c128"
    PRED = "pred"


_XLA_PT_TYPE_MAP: dict[str, torch.dtype] = dict(XLA_TO_TORCH)
_PT_XLA_TYPE_MAP: dict[torch.dtype, str] = dict(TORCH_TO_XLA)


class Shape:
    """An XLA shape in torch_xla's Python form: ``{'type': ..., 'sizes': ...}`` (plus
    ``'dynamic_dimensions'`` when given), or a tuple of those."""

    def __init__(self, shape: Any) -> None:
        self._shape = shape

    @classmethod
    def create(cls, dtype: Any, sizes: Sequence[int], dynamic_dimensions: Any = None) -> Shape:
        fields: dict[str, Any] = {"type": str(dtype), "sizes": tuple(sizes)}
        if dynamic_dimensions is not None:
            fields["dynamic_dimensions"] = tuple(dynamic_dimensions)
        return cls(fields)

    @property
    def shape(self) -> Any:
        return self._shape

    def is_tuple(self) -> bool:
        return isinstance(self._shape, (list, tuple))

    def tuple_size(self) -> int:
        assert self.is_tuple()
        return len(self._shape)

    def tuple_shape(self, index: int) -> Any:
        assert self.is_tuple()
        return self._shape[index]

    def _array(self) -> dict[str, Any]:
        assert not self.is_tuple()
        return self._shape

    def is_dynamic(self) -> bool:
        return "dynamic_dimensions" in self._array()

    def as_scalar(self) -> Shape:
        return Shape.create(self.dtype, ())

    @property
    def rank(self) -> int:
        return len(self._array()["sizes"])

    @property
    def sizes(self) -> tuple[int, ...]:
        return self._array()["sizes"]

    @property
    def dynamic_dimensions(self) -> Any:
        return self._array().get("dynamic_dimensions", None)

    @property
    def dtype(self) -> str:
        return self._array()["type"]


def _ops(values: Sequence[Op]) -> list[Any]:
    return [v.op for v in values]


def _attrs(arguments: dict[str, Any], *operands: str) -> dict[str, Any]:
    """A method's keyword attributes for its op: its arguments but ``self`` and the operands
    (which go to the op as inputs)."""
    return {k: v for k, v in arguments.items() if k != "self" and k not in operands}


class Op:
    """One op of a computation being built (wraps the builder's op handle ``op``).

    The methods follow XLA's operation semantics (https://openxla.org/xla/operation_semantics)
    under torch_xla's names.
    """

    def __init__(self, op: Any) -> None:
        self.op = op

    def shape(self) -> Shape:
        return Shape(torch_xla._XLAC._xla_op_shape(self.op))

    def builder(self) -> Any:
        return torch_xla._XLAC._xla_op_builder(self.op)

    def build(self, name: str) -> Any:
        return torch_xla._XLAC._xla_op_build(name, self.op)

    # -- shape ops
    def reshape(self, sizes, dimensions=None, inferred_dimension=None):
        return mkop(
            "Reshape",
            (self.op,),
            sizes=sizes,
            dimensions=dimensions,
            inferred_dimension=inferred_dimension,
        )

    def dynamic_reshape(self, sizes):
        return mkop("DynamicReshape", (self.op,), sizes=sizes)

    def broadcast(self, sizes):
        return mkop("Broadcast", (self.op,), sizes=sizes)

    def broadcast_in_dim(self, sizes, dimensions):
        return mkop("BroadcastInDim", (self.op,), sizes=sizes, dimensions=dimensions)

    def slice(self, start_indices, limit_indices, strides=None):
        steps = [1] * len(start_indices) if strides is None else strides
        return mkop(
            "Slice",
            (self.op,),
            start_indices=start_indices,
            limit_indices=limit_indices,
            strides=steps,
        )

    def slice_in_dim(self, start_index, limit_index, dimno, stride=1):
        return mkop(
            "SliceInDim",
            (self.op,),
            start_index=start_index,
            limit_index=limit_index,
            dimno=dimno,
            stride=stride,
        )

    def dynamic_slice(self, start_indices, slice_sizes):
        return mkop(
            "DynamicSlice", (self.op,), start_indices=_ops(start_indices), slice_sizes=slice_sizes
        )

    def dynamic_update_slice(self, update, start_indices):
        return mkop("DynamicUpdateSlice", (self.op, update.op), start_indices=_ops(start_indices))

    def transpose(self, permutation):
        return mkop("Transpose", (self.op,), permutation=permutation)

    def rev(self, dimensions):
        return mkop("Rev", (self.op,), dimensions=dimensions)

    def pad(self, value, config):
        return mkop("Pad", (self.op, value.op), config=config)

    def get_dimension_size(self, dimension):
        return mkop("GetDimensionSize", (self.op,), dimension=dimension)

    def set_dimension_size(self, size, dimension):
        return mkop("SetDimensionSize", (self.op, size.op), dimension=dimension)

    def get_tuple_element(self, index):
        return mkop("GetTupleElement", (self.op,), index=index)

    # -- indexing and windows
    def gather(
        self,
        start_indices,
        offset_dims,
        collapsed_slice_dims,
        start_index_map,
        index_vector_dim,
        indices_are_sorted=None,
    ):
        return mkop("Gather", (self.op, start_indices.op), **_attrs(locals(), "start_indices"))

    def scatter(
        self,
        scatter_indices,
        updates,
        computation,
        update_window_dims,
        inserted_window_dims,
        scatter_dims_to_operand_dims,
        index_vector_dim,
        indices_are_sorted=None,
        unique_indices=None,
    ):
        operands = (self.op, scatter_indices.op, updates.op)
        return mkop(
            "Scatter", operands, **_attrs(locals(), "scatter_indices", "updates", "operands")
        )

    def _scalar_computations(self, *named: tuple[str, Any]) -> list[Any]:
        # Reductions and window selections take computations of two scalars of this type.
        scalar = self.shape().as_scalar()
        return [Op.make_computation(name, fn, (scalar, scalar)) for name, fn in named]

    def select_and_scatter(
        self,
        source,
        init_value,
        window_dimensions,
        window_strides,
        select_computation,
        scatter_computation,
        padding="valid",
    ):
        select, scatter = self._scalar_computations(
            ("Select", select_computation), ("Scatter", scatter_computation)
        )
        return mkop(
            "SelectAndScatter",
            (self.op, source.op, init_value.op),
            window_dimensions=window_dimensions,
            window_strides=window_strides,
            select_computation=select,
            scatter_computation=scatter,
            padding=padding,
        )

    def select_and_scatter_with_general_padding(
        self,
        source,
        init_value,
        window_dimensions,
        window_strides,
        select_computation,
        scatter_computation,
        padding,
    ):
        select, scatter = self._scalar_computations(
            ("Select", select_computation), ("Scatter", scatter_computation)
        )
        return mkop(
            "SelectAndScatterWithGeneralPadding",
            (self.op, source.op, init_value.op),
            window_dimensions=window_dimensions,
            window_strides=window_strides,
            select_computation=select,
            scatter_computation=scatter,
            padding=padding,
        )

    def max_pool(
        self,
        kernel_size,
        stride,
        batch_dimension,
        feature_dimension,
        spatial_dimensions,
        padding="valid",
    ):
        return mkop(
            "MaxPool",
            (self.op,),
            kernel_size=kernel_size,
            stride=stride,
            batch_dimension=batch_dimension,
            feature_dimension=feature_dimension,
            spatial_dimensions=spatial_dimensions,
            padding=padding,
        )

    def reduce(self, init_value, computation, dimensions):
        (fn,) = self._scalar_computations(("Reduce", computation))
        return mkop("Reduce", (self.op, init_value.op), computation=fn, dimensions=dimensions)

    def reduce_all(self, init_value, computation):
        (fn,) = self._scalar_computations(("ReduceAll", computation))
        return mkop("ReduceAll", (self.op, init_value.op), computation=fn)

    def reduce_window(
        self, init_value, computation, window_dimensions, window_strides, padding="valid"
    ):
        (fn,) = self._scalar_computations(("ReduceWindow", computation))
        return mkop(
            "ReduceWindow",
            (self.op, init_value.op),
            computation=fn,
            window_dimensions=window_dimensions,
            window_strides=window_strides,
            padding=padding,
        )

    # -- convolutions
    def conv(
        self,
        kernel,
        window_strides,
        feature_group_count=1,
        batch_group_count=1,
        padding="valid",
        precision_config=None,
    ):
        return mkop(
            "Conv",
            (self.op, kernel.op),
            window_strides=window_strides,
            feature_group_count=feature_group_count,
            batch_group_count=batch_group_count,
            padding=padding,
            precision_config=precision_config,
        )

    def conv_with_general_padding(
        self,
        kernel,
        window_strides,
        padding,
        feature_group_count=1,
        batch_group_count=1,
        precision_config=None,
    ):
        return mkop(
            "ConvWithGeneralPadding",
            (self.op, kernel.op),
            window_strides=window_strides,
            feature_group_count=feature_group_count,
            batch_group_count=batch_group_count,
            padding=padding,
            precision_config=precision_config,
        )

    def conv_with_general_dimensions(
        self,
        kernel,
        window_strides,
        input_batch_dimension,
        input_feature_dimension,
        kernel_input_feature_dimension,
        kernel_output_feature_dimension,
        output_batch_dimension,
        output_feature_dimension,
        input_spatial_dimensions,
        kernel_spatial_dimensions,
        output_spatial_dimensions,
        padding="valid",
        feature_group_count=1,
        batch_group_count=1,
        precision_config=None,
    ):
        return mkop("ConvWithGeneralDimensions", (self.op, kernel.op), **_attrs(locals(), "kernel"))

    def conv_general(
        self,
        kernel,
        window_strides,
        padding,
        input_batch_dimension,
        input_feature_dimension,
        kernel_input_feature_dimension,
        kernel_output_feature_dimension,
        output_batch_dimension,
        output_feature_dimension,
        input_spatial_dimensions,
        kernel_spatial_dimensions,
        output_spatial_dimensions,
        feature_group_count=1,
        batch_group_count=1,
        precision_config=None,
    ):
        return mkop("ConvGeneral", (self.op, kernel.op), **_attrs(locals(), "kernel"))

    def conv_general_dilated(
        self,
        kernel,
        window_strides,
        padding,
        lhs_dilation,
        rhs_dilation,
        input_batch_dimension,
        input_feature_dimension,
        kernel_input_feature_dimension,
        kernel_output_feature_dimension,
        output_batch_dimension,
        output_feature_dimension,
        input_spatial_dimensions,
        kernel_spatial_dimensions,
        output_spatial_dimensions,
        feature_group_count=1,
        batch_group_count=1,
        precision_config=None,
    ):
        return mkop("ConvGeneralDilated", (self.op, kernel.op), **_attrs(locals(), "kernel"))

    # -- element types and selection
    def cast(self, to_type):
        return mkop("Convert", (self.op,), to_type=to_type)

    def bitcast(self, to_type):
        return mkop("BitcastConvert", (self.op,), to_type=to_type)

    def select(self, true_value, false_value):
        return mkop("Select", (self.op, true_value.op, false_value.op))

    def clamp(self, min_value, max_value):
        return mkop("Clamp", (self.op, min_value.op, max_value.op))

    # The misspelling is torch_xla's public name.
    def triangualr_solve(self, b, left_side=None, lower=None, unit_diagonal=None, transpose_a=None):
        return mkop(
            "TriangularSolve",
            (self.op, b.op),
            left_side=left_side,
            lower=lower,
            unit_diagonal=unit_diagonal,
            transpose_a=transpose_a,
        )

    def scalar_like(self, value):
        shape = self.shape()
        return Op.scalar(self.builder(), value, dtype=shape.dtype).broadcast(shape.sizes)

    def zeros_like(self):
        return self.scalar_like(0)

    def ones_like(self):
        return self.scalar_like(1)

    # -- control flow
    @classmethod
    def wrap_function(cls, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` as a computation body: a lone tuple parameter is passed as its elements, and
        a list or tuple result becomes a tuple op."""

        def body(*args, **kwargs):
            if len(args) == 1 and args[0].shape().is_tuple():
                packed = args[0]
                args = tuple(
                    packed.get_tuple_element(i) for i in range(packed.shape().tuple_size())
                )
            out = fn(*args, **kwargs)
            return Op.tuple(out) if isinstance(out, (list, tuple)) else out

        return body

    @classmethod
    def make_computation(cls, name, computation, args_or_shapes, **kwargs):
        if not callable(computation):
            return computation  # already built
        shapes = [a if isinstance(a, Shape) else a.shape() for a in args_or_shapes]
        return create_computation(name, Op.wrap_function(computation), shapes, **kwargs)

    def conditional(self, true_operand, false_operand, true_computation, false_computation):
        on_true = Op.make_computation("CondTrue", true_computation, (true_operand,))
        on_false = Op.make_computation("CondFalse", false_computation, (false_operand,))
        return mkop(
            "Conditional",
            (self.op, true_operand.op, false_operand.op),
            true_computation=on_true,
            false_computation=on_false,
        )

    def mkconditional(self, ops, true_fn, false_fn, **kwargs):
        operands = Op.tuple(ops)
        return self.conditional(operands, operands, true_fn, false_fn)

    def while_loop(self, condition_computation, body_computation):
        return mkop(
            "While",
            (self.op,),
            condition_computation=Op.make_computation("Condition", condition_computation, (self,)),
            body_computation=Op.make_computation("Body", body_computation, (self,)),
        )

    @classmethod
    def mkwhile(cls, ops, condition_fn, body_fn, **kwargs):
        return Op.tuple(ops).while_loop(
            condition_computation=condition_fn, body_computation=body_fn
        )

    # -- ops over several operands, and leaves
    @classmethod
    def _extract_xla_ops(cls, ops):
        return _ops(ops)

    @classmethod
    def tuple(cls, ops, builder=None):
        return mkop("Tuple", _ops(ops), builder=builder)

    @classmethod
    def concat_in_dim(cls, ops, dimension, builder=None):
        return mkop("ConcatInDim", _ops(ops), builder=builder, dimension=dimension)

    @classmethod
    def call(cls, computation, ops, builder=None):
        built = Op.make_computation("Call", computation, ops)
        return mkop("Call", _ops(ops), computation=built, builder=builder)

    @classmethod
    def constant(cls, builder, value):
        return mkleaf("Constant", builder, value=value)

    @classmethod
    def scalar(cls, builder, value, dtype=None):
        return mkleaf(
            "Constant", builder, value=torch.tensor(value, dtype=cls.to_torch_type(dtype))
        )

    @classmethod
    def iota(cls, builder, shape, iota_dimension):
        return mkleaf("Iota", builder, shape=shape.shape, iota_dimension=iota_dimension)

    # The constants 0 and 1 of an element type (f32 when none is given).
    @classmethod
    def zero(cls, builder, dtype=None):
        return Op.scalar(builder, 0, dtype)

    @classmethod
    def one(cls, builder, dtype=None):
        return Op.scalar(builder, 1, dtype)

    @classmethod
    def sort(cls, ops, comparator, dimension=None, is_stable=None):
        return mkop(
            "Sort", _ops(ops), comparator=comparator, dimension=dimension, is_stable=is_stable
        )

    @classmethod
    def map(cls, ops, computation, dimensions, static_operands=(), builder=None):
        return mkop(
            "Map",
            _ops(ops),
            builder=builder,
            computation=computation,
            dimensions=dimensions,
            static_operands=_ops(static_operands),
        )

    @classmethod
    def from_torch_type(cls, dtype):
        return _PT_XLA_TYPE_MAP[dtype]

    @classmethod
    def to_torch_type(cls, dtype):
        if not dtype:
            return torch.float32  # no type given: f32, as torch_xla's scalars default to
        return _XLA_PT_TYPE_MAP[dtype]


def _add_elementwise() -> None:
    """Op's operator overloads and one-operand math methods, each one XLA op."""

    def binary(kind: str) -> Callable[[Op, Op], Op]:
        def method(self: Op, rhs: Op) -> Op:
            return mkop(kind, (self.op, rhs.op))

        return method

    def unary(kind: str) -> Callable[[Op], Op]:
        def method(self: Op) -> Op:
            return mkop(kind, (self.op,))

        return method

    for attr, kind in {
        "__add__": "Add",
        "__sub__": "Sub",
        "__mul__": "Mul",
        "__matmul__": "Dot",
        "__truediv__": "Div",
        "__pow__": "Pow",
        "__mod__": "Rem",
        "__and__": "And",
        "__or__": "Or",
        "__xor__": "Xor",
        "__eq__": "Eq",
        "__ne__": "Ne",
        "__le__": "Le",
        "__lt__": "Lt",
        "__ge__": "Ge",
        "__gt__": "Gt",
        "__lshift__": "ShiftLeft",
        # torch_xla's op table spells this one ShifRight, so ``>>`` names an unknown op there.
        "__rshift__": "ShiftRight",
        "atan2": "Atan2",
        "max": "Max",
        "min": "Min",
    }.items():
        setattr(Op, attr, binary(kind))
    for attr, kind in {
        "__neg__": "Neg",
        "__not__": "Not",
        "acos": "Acos",
        "asin": "Asin",
        "atan": "Atan",
        "ceil": "Ceil",
        "cos": "Cos",
        "cosh": "Cosh",
        "erf": "Erf",
        "erfc": "Erfc",
        "erfinf": "ErfInv",
        "exp": "Exp",
        "expm1": "Expm1",
        "floor": "Floor",
        "log": "Log",
        "log1p": "Log1p",
        "sqrt": "Sqrt",
        "real": "Real",
        "imag": "Imag",
        "clz": "Clz",
        "conj": "Conj",
        "rsqrt": "Rsqrt",
        "sin": "Sin",
        "sinh": "Sinh",
        "tan": "Tan",
        "tanh": "Tanh",
    }.items():
        setattr(Op, attr, unary(kind))


_add_elementwise()
# Defining __eq__ drops the inherited hash; ops stay usable as dict keys by identity.
Op.__hash__ = object.__hash__  # type: ignore[method-assign]


def create_builder(name):
    return torch_xla._XLAC._xla_op_create_builder(name)


def mkshape(dtype, sizes, dynamic_dimensions=None):
    return Shape.create(dtype, sizes, dynamic_dimensions=dynamic_dimensions)


def mkparam(builder, param_no, shape):
    handle = torch_xla._XLAC._xla_op_param(builder, param_no, shape.shape)
    return Op(handle)


def mkleaf(name, builder, **kwargs):
    """An op with no operands (a constant, an iota) in ``builder``."""
    handle = torch_xla._XLAC._xla_op_create(builder, name, (), kwargs)
    return Op(handle)


def mkop(name, ops, **kwargs):
    """Op ``name`` on op handles ``ops``, in their builder unless ``builder=`` names one."""
    builder = kwargs.get("builder")
    if builder is None:
        assert ops, f"{name}: an op without operands needs builder="
        builder = torch_xla._XLAC._xla_op_builder(ops[0])
    handle = torch_xla._XLAC._xla_op_create(builder, name, ops, kwargs)
    return Op(handle)


def tensor_shape(tensor, device=""):
    if isinstance(tensor, (list, tuple)):
        return [Shape(torch_xla._XLAC._xla_op_tensor_shape(t, device)) for t in tensor]
    return Shape(torch_xla._XLAC._xla_op_tensor_shape(tensor, device))


def create_computation(name, fn, shapes, **kwargs):
    builder = create_builder(name)
    params = [mkparam(builder, number, shape) for number, shape in enumerate(shapes)]
    return fn(*params, **kwargs).build(name)


def computation_from_module_proto(name, proto):
    return torch_xla._XLAC._xla_op_computation_from_module_proto(name, proto)


def get_computation_hlo(computation):
    return torch_xla._XLAC._xla_computation_text(computation)


def xla_computation_as_func(computation, name=None):
    """A callable running ``computation`` on a list of XLA tensors (one IR node ``name``)."""
    opname = name or "xla::computation"
    if "::" not in opname:
        opname = "xla::" + opname

    def run(input_tensors):
        return torch_xla._XLAC._xla_user_computation(opname, input_tensors, computation)

    return run


class FlattenedInputFunc:
    """``orig_func`` called on a flat tuple of tensors: ``preprocess`` splits a call's
    ``(args, kwargs)`` pytree into its tensors (returned) and everything else (kept, with the
    tree's spec), ``flat_call`` rebuilds the call around new tensors and returns its flattened
    result, ``postprocess`` rebuilds the result's structure."""

    def __init__(self, orig_func: Callable[..., Any]) -> None:
        self.orig_func = orig_func
        self.non_tensors: tuple[Any, ...] | None = None
        self.in_spec: Any = None
        self.out_spec: Any = None
        # Marks where a tensor stood among the non-tensor leaves.
        self._sentinel = object()

    def flatten(self, inputs: Any) -> tuple[list[Any], Any]:
        return pytree.tree_flatten(inputs)

    def unflatten(self, flattened: Sequence[Any], spec: Any) -> Any:
        return pytree.tree_unflatten(list(flattened), spec)

    def preprocess(self, args: Any, kwargs: Any = None) -> tuple[Any, ...]:
        leaves, self.in_spec = self.flatten((args, kwargs or {}))
        self.non_tensors = tuple(
            self._sentinel if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves
        )
        return tuple(leaf for leaf in leaves if isinstance(leaf, torch.Tensor))

    def flat_call(self, flat_input: Sequence[Any]) -> list[Any]:
        assert self.in_spec is not None, "flat call only makes sense after preprocess is called"
        assert self.non_tensors is not None
        given = iter(flat_input)
        leaves = [next(given) if leaf is self._sentinel else leaf for leaf in self.non_tensors]
        args, kwargs = self.unflatten(leaves, self.in_spec)
        flat_out, self.out_spec = self.flatten(self.orig_func(*args, **kwargs))
        return flat_out

    def postprocess(self, res_flattened: Sequence[Any]) -> Any:
        assert self.out_spec is not None, "post process only makes sense after flat_call is called"
        return self.unflatten(res_flattened, self.out_spec)


class CompiledCallableWithCache(abc.ABC):
    """A function of tensors made shape-generic: ``specialize`` (a subclass's) builds a callable
    for one set of input shapes and dtypes (and non-tensor arguments), kept for the next call
    with the same."""

    def __init__(self, flat_input_func: FlattenedInputFunc) -> None:
        self._cache: dict[Any, Callable[[Sequence[Any]], Any]] = {}
        self._flat_input_func = flat_input_func

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        func = self._flat_input_func
        tensors = func.preprocess(args, kwargs)
        avals = tuple(None if t is None else (t.shape, t.dtype) for t in tensors)
        key = (avals, func.non_tensors, func.in_spec)
        specialized = self._cache.get(key)
        if specialized is None:
            specialized = self._cache[key] = self.specialize(tensors)
        return func.postprocess(specialized(tensors))

    @abc.abstractmethod
    def specialize(self, sample_flat_args: Sequence[Any]) -> Callable[[Sequence[Any]], Any]: ...


class JaxFlattenedInputFunc(FlattenedInputFunc):
    """A JAX function's flattening: JAX's pytrees (they know JAX containers such as a
    ``jax.vjp`` residual), and torch dtypes among the arguments passed on as JAX dtypes."""

    def preprocess(self, args: Any, kwargs: Any = None) -> tuple[Any, ...]:
        tensors = super().preprocess(args, kwargs)
        assert self.non_tensors is not None
        to_jax = jax_interop.layer().jax_dtype
        self.non_tensors = tuple(
            to_jax(leaf) if isinstance(leaf, torch.dtype) else leaf for leaf in self.non_tensors
        )
        return tensors

    def flatten(self, inputs: Any) -> tuple[list[Any], Any]:
        return jax_interop.layer().tree_flatten(inputs)

    def unflatten(self, flattened: Sequence[Any], spec: Any) -> Any:
        return jax_interop.layer().tree_unflatten(spec, flattened)


class JaxCallable(CompiledCallableWithCache):
    """A JAX function on XLA tensors, jitted once per input shapes; each call is one
    ``xla::jax_func`` node computed by JAX on the CPU (``xlasim.runtime.jax_interop``)."""

    def __init__(self, jax_func: Callable[..., Any]) -> None:
        super().__init__(JaxFlattenedInputFunc(jax_func))

    def specialize(self, sample_flat_args: Sequence[Any]) -> Callable[[Sequence[Any]], Any]:
        avals = [None if a is None else (tuple(a.shape), a.dtype) for a in sample_flat_args]
        lowered = jax_interop.lower(self._flat_input_func.flat_call, avals)

        def run(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
            return jax_interop.run("xla::jax_func", tensors, lowered)

        return run


class XlaCallable(CompiledCallableWithCache):
    """A function written with this module's ops, built once per input shapes into a
    computation that runs as one node."""

    def __init__(self, xla_func: Callable[..., Any]) -> None:
        super().__init__(FlattenedInputFunc(xla_func))

    def specialize(self, sample_flat_args: Sequence[Any]) -> Callable[[Sequence[Any]], Any]:
        name = "xla::computation"
        builder = create_builder(name)
        params = [
            mkparam(builder, number, mkshape(Op.from_torch_type(a.dtype), a.shape))
            for number, a in enumerate(sample_flat_args)
        ]
        root = Op.tuple(self._flat_input_func.flat_call(params))
        return xla_computation_as_func(root.build(name), name)


# (function id or override_hash, JAX trace context) -> its JaxCallable.
_JAX_TO_XLA_COMPUTATION_CACHE: dict[Any, JaxCallable] = {}


def _jax_to_xla_computation_cache_elements() -> int:
    """How many input-shape specializations all cached JAX functions hold (each a lowering)."""
    return sum(len(callable_._cache) for callable_ in _JAX_TO_XLA_COMPUTATION_CACHE.values())


@requires_jax
def call_jax(jax_func, args, kwargs=None, name=None, override_hash=None):
    """Calls the JAX function ``jax_func`` on ``args``/``kwargs``, whose XLA tensors it sees as
    JAX arrays; returns its results as XLA tensors.

    As in torch_xla, the function is traced and lowered once per input shapes (keyed by
    ``override_hash``, else ``id(jax_func)``, and JAX's trace context) and each call is one node
    of the lazy graph. On the simulator JAX runs the lowered function on the CPU.
    """
    layer = jax_interop.layer()
    # A torchax tensor exists only once torchax is imported; the check imports nothing (an
    # installed torchax may not import with this torch, and plain calls do not need it).
    torchax_tensor = sys.modules.get("torchax.tensor")
    leaves, _ = pytree.tree_flatten((args, kwargs))
    if torchax_tensor is not None and any(isinstance(a, torchax_tensor.Tensor) for a in leaves):
        # Already inside a torchax trace (e.g. under assume_pure): torchax calls it directly.
        torchax = maybe_get_torchax()
        assert torchax is not None
        return torchax.interop.call_jax(jax_func, *args, **(kwargs or {}))
    key = (override_hash or id(jax_func), layer.trace_context())
    wrapped = _JAX_TO_XLA_COMPUTATION_CACHE.get(key)
    if wrapped is None:
        wrapped = _JAX_TO_XLA_COMPUTATION_CACHE[key] = JaxCallable(jax_func)
    return wrapped(*args, **(kwargs or {}))


def create_placeholder_tensor(shape, dtype):
    raise NotImplementedError(
        "xlasim does not simulate placeholder tensors "
        "(torch_xla.core.xla_builder.create_placeholder_tensor)"
    )
