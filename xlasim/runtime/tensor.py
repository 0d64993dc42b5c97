"""Simulated ``xla`` device tensors: a wrapper subclass around a CPU tensor.

Ops compute eagerly on the wrapped CPU tensor, so results equal eager CPU torch bit for bit,
while each op also records a lazy-IR node (see :mod:`xlasim.runtime.graph`) so compile
accounting follows what real torch_xla would do with the same program.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import itertools
import time
import weakref
from collections.abc import Iterator
from typing import Any

import torch

from xlasim.runtime import data_keys, dry_run, memory, op_checks
from xlasim.runtime import dynamic_dims as _dynamic_dims
from xlasim.runtime import errors as _errors
from xlasim.runtime import graph as _graph
from xlasim.runtime import graph_limit as _graph_limit
from xlasim.runtime import legacy_bf16 as _legacy_bf16
from xlasim.runtime import legacy_long as _legacy_long
from xlasim.runtime import numerics as _numerics
from xlasim.runtime import state as _runtime
from xlasim.runtime import strided as _strided
from xlasim.runtime import unfunctionalized as _unfunctionalized
from xlasim.runtime.device import FactoryKernels, set_wrapper_shape, xla_strides
from xlasim.runtime.graph import CompileError, CustomCall, InputRef, Node, RecordedCall, stable_id
from xlasim.runtime.kernel_counters import COPY_TO_HOST, EMPTY, EMPTY_STRIDED, kernel_counters
from xlasim.runtime.kernel_inputs import check_cpu_inputs, rules_for
from xlasim.runtime.lowerings import fallback_name
from xlasim.sharding.messages import torch_xla_error
from xlasim.sharding.op_sharding import OpSharding, ProtoType
from xlasim.sharding.tensor_sharding import TensorSharding

aten = torch.ops.aten

_CPU = torch.device("cpu")
_LONG_DTYPES = _legacy_long.LONG_DTYPES
_creation_order = itertools.count()

# Ops whose result carries the very IR value of their input in torch_xla (no new node).
_IDENTITY_OPS = frozenset({aten.detach.default, aten.alias.default, aten.lift_fresh.default})
_devices: dict[int, torch.device] = {}

_TENSOR_DATA: Any = torch._C.TensorBase.data  # the C getset descriptor


def xla_device(index: int | None) -> torch.device:
    index = index or 0
    dev = _devices.get(index)
    if dev is None:
        dev = _devices[index] = torch.device("xla", index)
    return dev


def device_indices() -> list[int]:
    """The indices of every ``xla`` device a simulated tensor has been placed on."""
    return sorted(_devices)


class XlaSimTensor(torch.Tensor):
    _elem: torch.Tensor
    _node: Node | None
    _sharding: Any

    _seq: int
    _leaf: Any
    _aliased: bool
    _on_host: bool
    """Under SPMD, data moved with ``.to('xla')``/``copy_`` stays on the host until the tensor
    is sharded or first used (torch_xla defers the upload for the virtual device)."""
    _uploaded_at: int | None
    """The runtime's step-barrier count when the data was moved from the host (None when the
    value came otherwise): what torch_xla's debug text shows depends on it."""
    _moved_at: int | None
    """Under SPMD, the step-barrier count when ``.to('xla')``/``copy_`` deferred the data's
    upload (None otherwise): a barrier passed while it waits uploads it replicated, and
    torch_xla then keeps the host copy too."""
    _computed: bool
    """The data is the output of an executed graph."""
    _spec_on_ir: bool
    """Under SPMD, moved data that a clone or copy gave a replicated sharding: torch_xla sets
    the spec on its ``device_data`` IR value and holds no sharded data for it until the next
    step barrier."""

    _device: torch.device
    _rt: Any
    """The ``SimRuntime`` the tensor was made in: it cannot be used in another one."""
    _buf: Any
    """The device buffer holding its data (``xlasim.runtime.hbm.Buffer``), None while the
    value is pending (computed since the last sync, not yet materialized)."""
    _manual: list[torch.Tensor] | None
    """Under manual sharding, each device's own value (in global device order; ``_elem`` is
    the first): ops on it run once per device, as the partitioned program does."""
    _copied: tuple[torch.Tensor, int, int, str] | None
    """A view torch_xla makes that the CPU values could only take as a copy (a transposed
    tensor viewed to a new shape): the source's values (kept alive), their storage, its count
    of writes then, and the op (see :func:`_layout_view`). None for every other tensor."""
    _slice_root: XlaSimTensor | None
    """The tensor a chain of ``slice`` views (or ``as_strided``) started from, which
    torch_xla keeps on each of them and reads ``as_strided`` against; None for the rest."""

    __slots__ = (
        "_elem",
        "_node",
        "_sharding",
        "_seq",
        "_leaf",
        "_aliased",
        "_on_host",
        "_uploaded_at",
        "_moved_at",
        "_computed",
        "_spec_on_ir",
        "_device",
        "_rt",
        "_buf",
        "_manual",
        "_copied",
        "_slice_root",
    )

    @staticmethod
    def __new__(cls, elem: torch.Tensor, device: torch.device, node: Node | None = None):
        return _new(elem, device, node, _runtime.current())

    def __repr__(self, *, tensor_contents: Any = None) -> Any:  # type: ignore[override]
        materialize([self])
        if self._elem.is_meta:
            raise dry_run.needs_values("printing a device tensor")
        # The CPU tensor's text with the device as the first suffix, where torch puts it; the
        # data ends at the last bracket (or, for a 0-dim tensor, at the first suffix).
        body = torch._tensor_str._str(self._elem.detach())[:-1]
        if self.dim() == 0:
            end = body.find(", ")
            end = len(body) if end < 0 else end
        else:
            end = body.rfind("]") + 1
        grad = self.grad_fn
        extra = (
            f", grad_fn=<{type(grad).__name__}>"
            if grad is not None
            else (", requires_grad=True" if self.requires_grad else "")
        )
        text = f"{body[:end]}, device='{self.device}'{body[end:]}{extra})"
        # nn.Parameter of a wrapper subclass keeps the subclass; torch's Parameter repr.
        return "Parameter containing:\n" + text if self._is_parameter() else text

    def _is_parameter(self) -> bool:
        return bool(getattr(self, "_is_param", False))

    def __format__(self, format_spec: str) -> str:
        # torch formats a 0-dim plain tensor as its value; a Parameter (another class in real
        # torch_xla) and a tensor with dimensions as their text, refusing a format spec.
        if self.dim() == 0 and not self._is_parameter():
            return self.item().__format__(format_spec)
        if format_spec:
            name = "Parameter" if self._is_parameter() else "Tensor"
            raise TypeError(f"unsupported format string passed to {name}.__format__")
        return str(self)

    def __coerce_same_metadata_as_tangent__(
        self, expected_metadata: Any, expected_type: type | None = None
    ) -> XlaSimTensor | None:
        # AOTAutograd expects a plain torch.Tensor tangent, which is what a torch_xla device
        # tensor is; this wrapper class is the simulator's way of being one.
        if expected_type not in (None, torch.Tensor) or expected_metadata is not None:
            return None
        return self

    def tolist(self) -> Any:
        return self.cpu().tolist()

    def numpy(self, *, force: bool = False) -> Any:
        if force:
            return self.cpu().numpy()
        raise TypeError(
            f"can't convert {self.device} device type tensor to numpy. Use Tensor.cpu() to "
            "copy the tensor to host memory first."
        )

    def __reduce_ex__(self, proto: Any) -> Any:
        # Pickle like a plain xla tensor (rebuilt from a CPU copy onto its device), not as a
        # subclass: that is what torch does for real xla tensors, and weights_only loads it.
        if self._is_parameter():
            # As nn.Parameter pickles: its detached data and the flag, rebuilt as a
            # Parameter (the data's CPU copy must not carry the gradient graph).
            return (
                torch._utils._rebuild_parameter,
                (self.detach(), self.requires_grad, collections.OrderedDict()),
            )
        return self._reduce_ex_internal(proto)

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        # torch's default for a subclass clones and then deep-copies every slot onto the
        # clone, handing the copy duplicates of this tensor's runtime, graph node and device
        # buffer (a tensor of no slice). An xla tensor deep-copies as its clone.
        if id(self) in memo:
            return memo[id(self)]
        if not self.is_leaf:
            return torch.Tensor.__deepcopy__(self, memo)  # torch's own refusal for non-leaves
        with torch.no_grad():
            copied = self.clone()
        copied.requires_grad_(self.requires_grad)
        if self.grad is not None:
            copied.grad = copy.deepcopy(self.grad, memo)
        copied.__dict__ = copy.deepcopy(self.__dict__, memo)
        memo[id(self)] = copied
        return copied

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    @property
    def data(self) -> torch.Tensor:
        return _TENSOR_DATA.__get__(self)

    @data.setter
    def data(self, value: torch.Tensor) -> None:
        # torch's setter swaps only the C++ metadata (dtype, shape); the value lives in this
        # wrapper's slots. torch_xla's tensor then holds the new tensor's device data, so the
        # wrapper takes the new value as an alias of it (``Module.to(dtype)`` sets
        # ``param.data`` to the converted tensor this way).
        _TENSOR_DATA.__set__(self, value)
        if type(value) is XlaSimTensor and value is not self:
            _take_value(self, value)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[override]
        if len(types) > 1 and any(not issubclass(t, XlaSimTensor) for t in types):
            # Another tensor subclass is among the arguments (an XLAShardedTensor): its
            # handler unwraps it and comes back here with xla tensors only.
            return NotImplemented
        info = _op_info(func)
        if info.metadata:
            return _METADATA[func]
        if info.counters and _kernels_counted:
            counters = _runtime.current().metrics
            names = info.counters
            if info.op is _COPY and type(args[0]) is not XlaSimTensor:
                names = COPY_TO_HOST
            for name in names:
                counters.inc(name)
        if _dynamic_dims.SEEN and _dynamic_dims.involved(args, kwargs):
            return _dynamic_op(info, args, kwargs)
        return _dispatch(info, args, kwargs)


_make_wrapper = torch.Tensor._make_wrapper_subclass


def _dispatch(info: _OpInfo, args: Any, kwargs: Any) -> Any:
    """One op call on xla tensors of static shapes."""
    func = info.op
    if info.written and data_keys.keeping():
        _keep_written(info, args, kwargs)
    if _COPIES_SEEN and info.written:
        _refuse_copy_writes(info, args, kwargs)
        # Counted here too for the paths that write without ``_update``: a CPU fallback,
        # an argument written but not returned.
        _count_written(info, args, kwargs)
    if _MANUAL_SEEN and _any_manual(args, kwargs):
        return _run_per_device(info, args, kwargs or {})
    if info.handler is not None:
        out = info.handler(func, args, kwargs or {})
    elif info.fallback is not None:
        return _cpu_fallback(info, info.fallback, args, kwargs or {})
    elif info.identity:
        return _identity(info, args[0])
    elif _graph.RECORD_CALLS:
        out = _run_recorded(info, args, kwargs)
    else:
        out = _run(info, args, kwargs)
    if _COPIES_SEEN and info.view:
        _inherit_copy(args[0], out)
    if _graph.EAGER_SEEN:
        graphs = _runtime.current().graphs
        if graphs.use_eager_mode:
            _run_eagerly(graphs, out)
    return out


def _dynamic_op(info: _OpInfo, args: Any, kwargs: Any) -> Any:
    """An op with an operand of a dynamic dimension, or given a dynamic size: it computes on
    the real sizes, and its new results then take their dynamic dimensions."""
    _dynamic_dims.check_operands(info.op, args)
    at_bounds = None
    if not _dynamic_dims.view_op(info.op):  # XLA's static check comes first; a view's after
        try:
            at_bounds = _dynamic_dims.static_shapes(info.op, args, kwargs)
        except RuntimeError as exc:
            message = _errors.translate(info.op, tuple(args), exc)
            if message is None:
                raise
            raise RuntimeError(message) from None
    try:
        out = _dispatch(
            info,
            tuple(_dynamic_dims.concrete(a) for a in args),
            {k: _dynamic_dims.concrete(v) for k, v in kwargs.items()} if kwargs else kwargs,
        )
    except RuntimeError:
        misfit = _dynamic_dims.view_misfit(info.op, args)
        if misfit is None:
            raise
        raise misfit from None
    inputs = {id(a) for a in args if type(a) is XlaSimTensor}
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    if not any(type(o) is XlaSimTensor and id(o) not in inputs for o in outs):
        return out  # in place, or a result on the host
    sizes = _dynamic_dims.output_sizes(
        info.op, args, kwargs, out, at_bounds, _runtime.current().metrics
    )
    for i, (o, dims) in enumerate(zip(outs, sizes, strict=True)):
        if dims is None or type(o) is not XlaSimTensor or id(o) in inputs:
            continue
        if any(_dynamic_dims.is_dynamic(d) for d in dims):
            outs[i] = with_sizes(o, dims)
    return type(out)(outs) if isinstance(out, (tuple, list)) else outs[0]


def with_sizes(t: XlaSimTensor, sizes: list[Any]) -> XlaSimTensor:
    """``t``'s value with ``sizes``, dynamic ones among them (the new wrapper holds the same
    value; the old one is dropped)."""
    _dynamic_dims.SEEN = True
    r = _make_wrapper(
        XlaSimTensor,
        sizes,
        None,
        None,
        None,
        t.dtype,
        t.layout,
        t._device,
        False,
        False,
        "strides",
    )
    for slot in XlaSimTensor.__slots__:
        setattr(r, slot, getattr(t, slot))
    if t._node is not None:
        t._rt.graphs.pending.append(weakref.ref(r))
    return r


def _dynamic_result(func, args, kwargs):
    """``nonzero``/``masked_select``: torch_xla's CPU fallback, or with the op named in
    ``XLA_EXPERIMENTAL`` (read at each call) its lowering, whose first dimension is dynamic,
    bounded by the element count. torch_xla runs the graph of the size when it makes the
    tensor (it compiles once per graph, as any other)."""
    info = _op_info(func)
    if not _dynamic_dims.lowered_dynamic(func):
        return _cpu_fallback(info, fallback_name(func) or "", args, kwargs)
    out = _run_op(func, args, kwargs)
    elem = out._elem
    if func is aten.nonzero.default:
        bound = args[0].numel()
        elem = elem.to(torch.int32)  # torch_xla 2.9's index type (measured on CPU)
    else:
        bound = torch.broadcast_shapes(args[0].shape, args[1].shape).numel()
    value = _new(elem, out._device, out._node, out._rt)
    sizes = [_dynamic_dims.dynamic(bound, elem.shape[0], out._rt.metrics), *elem.shape[1:]]
    t = with_sizes(value, sizes)
    size = derived(t, torch.tensor(elem.shape[0], dtype=torch.int32), "aten::size")
    materialize([size])
    return t


# The metadata queries a wrapper made with the "strides" policy sends here, and the answers:
# torch_xla's tensors are contiguous in every memory format (channels-last included: XLA owns
# the layout), and their strides (row-major, set on the wrapper) are asked of torch as usual
# (None: the wrapper's own), as are the layout tests computed from them.
_METADATA: dict[Any, bool | None] = {
    aten.is_contiguous.default: True,
    aten.is_contiguous.memory_format: True,
    aten.stride.default: None,
    aten.sym_stride.default: None,
    aten.is_strides_like_format.default: None,
    aten.is_non_overlapping_and_dense.default: None,
}


# What a tensor's value is: every slot but its own identity (``_seq``).
_VALUE_SLOTS = tuple(slot for slot in XlaSimTensor.__slots__ if slot != "_seq")


def _take_value(dst: XlaSimTensor, src: XlaSimTensor) -> None:
    """``dst.data = src``: ``dst`` now holds ``src``'s value (its IR value, buffer and state)."""
    note_write(dst)
    for slot in _VALUE_SLOTS:
        setattr(dst, slot, getattr(src, slot))
    if src._node is not None:
        _runtime.current().graphs.pending.append(weakref.ref(dst))


def _identity(info: _OpInfo, src: XlaSimTensor, kwargs: Any = None) -> XlaSimTensor:
    """An op whose result is its input's IR value (no new node)."""
    runtime = _runtime.current()
    if src._rt is not runtime:
        raise _foreign(src, runtime)
    value = info.call(src._elem, **kwargs) if kwargs else info.call(src._elem)
    out = _new(value, src._device, src._node, runtime)
    if src._copied is not None:
        _check_copy_fresh(src)
        if info.op is not aten.clone.default:  # an alias holds the same copy
            _hold_copy(out, src._copied)
    if info.op is not aten.clone.default:  # an alias keeps the slice's root; a clone does not
        out._slice_root = src._slice_root
    out._sharding = src._sharding
    out._buf = src._buf  # the same value: one buffer
    # The alias holds the same data in the same state (on the host still, moved at the same
    # barrier...); torch_xla uploads each alias at its own first use.
    out._on_host, out._uploaded_at, out._moved_at = src._on_host, src._uploaded_at, src._moved_at
    out._computed, out._spec_on_ir = src._computed, src._spec_on_ir
    if src._node is not None:
        runtime.graphs.pending.append(weakref.ref(out))
    return out


def _new(elem: torch.Tensor, device: torch.device, node: Node | None, rt: Any) -> XlaSimTensor:
    """A wrapper of ``elem`` on ``device`` (the op path's constructor: no Python ``__new__``).

    Arguments go to torch positionally (size, strides, storage_offset, memory_format, dtype,
    layout, device): keyword parsing is a good part of the call's cost.

    The wrapper reports torch_xla's metadata, not ``elem``'s: row-major strides over its shape
    and storage offset 0 for every tensor, views included (PyTorch picks some backward formulas
    by strides, so the graphs follow them); ``elem`` keeps whatever layout computing gives it.
    torch's own contiguous strides are the same unless a dimension is 0.
    """
    size = elem.size()
    r = _make_wrapper(
        XlaSimTensor,
        size,
        xla_strides(size) if elem.numel() == 0 else None,
        None,
        None,
        elem.dtype,
        elem.layout,
        device,
        False,
        False,
        "strides",  # contiguity and stride queries come to __torch_dispatch__ (_METADATA)
    )
    r._elem = elem
    r._device = device
    r._rt = rt
    r._node = node
    r._sharding = None
    r._buf = None
    r._manual = None
    r._copied = None
    r._slice_root = None
    r._leaf = None
    # True while pending IR updates device data in place (XLA aliases that buffer).
    r._aliased = False
    r._on_host = False
    r._uploaded_at = None
    r._moved_at = None
    r._computed = False
    r._spec_on_ir = False
    # torch_xla orders a graph's outputs by tensor creation; so do we.
    r._seq = next(_creation_order)
    if rt is not None and rt.float_storage != "" and elem.is_floating_point():
        _store_as_legacy_bf16(rt, elem)
    elif rt is not None and rt.long_storage is not False and elem.dtype in _LONG_DTYPES:
        _store_as_legacy_long(rt, elem)
    return r


def _store_as_legacy_long(rt: Any, elem: torch.Tensor) -> None:
    """XLA_USE_32BIT_LONG, read at the runtime's first 64-bit integer tensor."""
    if rt.long_storage is None:
        rt.long_storage = _legacy_long.read_mode()
    if rt.long_storage:
        _legacy_long.wrap_in_place(elem)


def _store_as_legacy_bf16(rt: Any, elem: torch.Tensor) -> None:
    """XLA_USE_BF16 / XLA_DOWNCAST_BF16, read at the runtime's first floating tensor."""
    mode = rt.float_storage
    if mode is None:
        mode = rt.float_storage = _legacy_bf16.read_mode()
    if mode:
        _legacy_bf16.round_in_place(elem, mode)


class _OpInfo:
    """What the dispatcher needs to know of one op overload, worked out on its first call."""

    __slots__ = (
        "op",
        "call",
        "key",
        "handler",
        "identity",
        "view",
        "written",
        "metadata",
        "generator",
        "cpu_rules",
        "fallback",
        "scalar_slots",
        "counters",
    )

    written: tuple[tuple[int, str], ...]
    scalar_slots: frozenset[int | str]
    handler: Any
    call: Any

    def __init__(self, op: Any) -> None:
        self.op = op
        # The overload's C++ callable: ``OpOverload.__call__`` only forwards to it; for a
        # matmul-class op, one that computes as the TPU's matrix unit does.
        self.call = _numerics.emulated(op) or getattr(op, "_op", op)
        self.key = stable_id(op)
        self.handler = _SPECIAL.get(op)
        self.identity = op in _IDENTITY_OPS
        self.view = bool(op.is_view)
        self.metadata = op in _METADATA
        if self.metadata:  # answered at once: no schema in the dispatcher to look at
            self.written, self.generator, self.cpu_rules, self.fallback = (), False, None, None
            self.scalar_slots = frozenset()
            self.counters: tuple[str, ...] = ()
            return
        # Where a Python number becomes device data (position and name): a tensor or number
        # argument, but pow's exponent, which its lowering writes into the graph.
        self.scalar_slots = (
            frozenset()
            if op in _POW_SCALAR
            else frozenset(
                slot
                for i, a in enumerate(op._schema.arguments)
                if str(a.type) in _SCALAR_TYPES
                for slot in (i, a.name)
            )
        )
        # The arguments it writes (position, name): in-place and out= ops.
        self.written = tuple(
            (i, a.name)
            for i, a in enumerate(op._schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write
        )
        # Simulated devices draw from the runtime's own generator, as torch_xla's device RNG
        # is separate from the CPU one (seeded by torch_xla.manual_seed).
        self.generator = any(a.name == "generator" for a in op._schema.arguments)
        # Arguments torch_xla's kernel refuses as CPU tensors (most ops: none).
        self.cpu_rules = rules_for(op)
        # The counter of torch_xla's CPU fallback for an op it does not lower (most: None).
        plain = self.handler is None and not self.identity
        self.fallback = fallback_name(op) if plain else None
        # What torch_xla's kernels count for a call (its ``xla::`` counters).
        self.counters = kernel_counters(op)


_CLAMPS = frozenset({aten.clamp.default, aten.clamp_.default})
_SCALAR_TYPES = frozenset({"Tensor", "Optional[Tensor]", "number", "Optional[number]"})
_POW_SCALAR = frozenset({aten.pow.Tensor_Scalar, aten.pow_.Scalar, aten.pow.Tensor_Scalar_out})


# Keyed by id(op) (an OpOverload's own __hash__ is a Python call); the entry keeps the op
# alive and is checked against it, so an id reused by a new object is never mistaken.
_OPS: dict[int, _OpInfo] = {}


def _op_info(op: Any) -> _OpInfo:
    info = _OPS.get(id(op))
    if info is None or info.op is not op:
        info = _OPS[id(op)] = _OpInfo(op)
    return info


def compute(op: Any) -> Any:
    """The callable computing aten op ``op`` on CPU values as the simulated device does (a
    matmul-class op at the TPU's precision)."""
    return _op_info(op).call


def _leaf_key(t: XlaSimTensor) -> data_keys.DataKey:
    """A device-data input as the graph hash sees it (made an ``InputInfo`` only on demand)."""
    sharding = t._sharding
    shape = _dynamic_dims.xla_shape(t) if _dynamic_dims.SEEN else tuple(t.shape)
    return data_keys.new_key(shape, t.dtype, sharding.op.to_string() if sharding else "", t)


def _arg_key(a: Any) -> Any:
    """What of a non-tensor argument goes into the graph hash.

    Python floats become device data in torch_xla (so changing a learning rate does not
    recompile); ints, bools, strings, shapes and dtypes are baked into the graph. Only values
    whose ``hash()`` is the same in every process are returned (``hash`` of a str, a type or,
    on Python < 3.12, None is salted per process), so the persistent cache works across them.
    """
    if a is None:
        return 0
    if isinstance(a, int):  # bool included
        return a
    if isinstance(a, float):
        return _FLOAT_KEY
    if isinstance(a, (list, tuple)):
        return tuple(_arg_key(x) for x in a)
    if isinstance(a, torch.Tensor):  # CPU tensor folded into the graph as a constant
        return (_CONST_KEY, tuple(a.shape), stable_id(a.dtype))
    # str, dtype, device, memory_format, layout, enums...: by their text.
    return stable_id(a)


_FLOAT_KEY = stable_id("<float>")
_CONST_KEY = stable_id("<const>")


def _leaf_entry(t: XlaSimTensor) -> tuple[Any, tuple[Any, ...], int]:
    """(sharding it was computed for, leaf key, leaf hash), cached on the tensor."""
    sharding = t._sharding
    cached = t._leaf
    if cached is not None and cached[0] is sharding:
        return cached
    key = _leaf_key(t)
    entry = (sharding, key, hash((key[0], stable_id(key[1]), stable_id(key[2]))))
    t._leaf = entry
    _DATA_HOLDERS[id(key)] = t
    return entry


_COPY = torch.ops.aten.copy_.default


def _check_has_data(t: XlaSimTensor, overwritten: bool) -> None:
    """``t`` has no data (its pending IR dropped): reading it fails; a copy into it needs
    none. (A buffer donated to a program: ``runtime.donation``.)"""
    if overwritten:
        return
    raise NotImplementedError(
        "xlasim does not simulate reading a tensor whose pending IR _clear_pending_irs dropped "
        "(torch_xla holds no data for it)"
    )


def _overwrite_donated(t: XlaSimTensor, runtime: Any) -> None:
    """A copy fills ``t`` whole: if its buffer was donated (a program that aliased it ran),
    the copy lands in new data rather than reading the deleted buffer."""
    if runtime.graphs.donors.deleted_on(leaf_input(t)) is not None:
        t._leaf = None


def clear_pending(t: XlaSimTensor) -> None:
    """Drops ``t``'s pending IR; it is left as device data without data behind it."""
    t._node, t._leaf = None, None
    memory.settle(_runtime.current(), t)
    t._buf.cleared = True


# A graph records a device-data input by its leaf key; this finds the tensor holding that data
# (weakly: a graph does not keep its inputs' tensors alive), for the queries that list a
# graph's device data as torch_xla's IR does.
_DATA_HOLDERS: weakref.WeakValueDictionary[int, XlaSimTensor] = weakref.WeakValueDictionary()


def data_holder(key: Any) -> XlaSimTensor | None:
    """The live tensor whose device data a graph recorded as ``key`` (None when that tensor
    is gone or holds other data now)."""
    t = _DATA_HOLDERS.get(id(key))
    if t is None or t._node is not None or t._leaf is None or t._leaf[1] is not key:
        return None
    return t


def device_data_key(t: XlaSimTensor) -> Any:
    """The key graphs record for device-data tensor ``t`` as an input."""
    return _leaf_entry(t)[1]


def _ir_value(t: XlaSimTensor) -> tuple[Any, int]:
    """``t``'s IR value as a graph input (its pending node, or its device-data key) and that
    value's hash. ``_take`` does the same inline: it is on every op's path."""
    node = t._node
    if node is None:
        entry = _leaf_entry(t)
        return entry[1], entry[2]
    return node, node.hash


def ir_hash(t: XlaSimTensor) -> int:
    """The hash of ``t``'s IR value: its pending node's, or its device-data key's."""
    return _ir_value(t)[1]


def _unwrap_other(
    a: Any, parts: list[Any], inputs: list[Any], wrappers: list[XlaSimTensor], rt: Any
) -> Any:
    """A non-tensor argument (or a list of tensors) unwrapped, its hash material recorded."""
    if type(a) is XlaSimTensor:
        _take(a, parts, inputs, wrappers, rt)
        return a._elem
    if type(a) is list or type(a) is tuple:
        # Any tensor, not only a first one: index's indices are None where a dim is kept.
        if any(isinstance(x, torch.Tensor) for x in a):
            return type(a)(_unwrap_other(x, parts, inputs, wrappers, rt) for x in a)
        parts.append(_arg_key(a))
        return a
    if isinstance(a, torch.device) and a.type == "xla":
        # Where the values live: an op asked for an xla device (the backward of a dtype cast
        # names the input's device) runs on the storage, meta in a dry run.
        return dry_run.META if rt.dry_run else _CPU
    parts.append(_arg_key(a))
    return a


def mark_uploaded(t: Any, rt: Any) -> None:
    """``t``'s data has just been moved from the host to its device(s)."""
    t._on_host = False
    t._uploaded_at = rt.step_barriers
    t._moved_at = None
    t._computed = False


def upload_deferred(t: XlaSimTensor, rt: Any) -> None:
    """The upload torch_xla deferred to the tensor's first use: of ``.to('xla')`` under SPMD,
    or of a CPU fallback's result."""
    start = time.perf_counter_ns()
    rt.metrics.to_device(memory.sent_bytes(rt, t), start)
    moved_at = t._moved_at
    mark_uploaded(t, rt)
    t._moved_at = moved_at
    if rt.spmd:
        rt.graphs.moved_in_use.append(weakref.ref(t))


def _replicate_moved(src: XlaSimTensor, rt: Any) -> None:
    """Cloning or copying data moved from the host under SPMD uploads it replicated:
    torch_xla 2.9 then reports ``'{replicated}'`` for the source at once (and for the copy,
    which takes the source's spec), where a mere use leaves it ``''`` until the next step
    barrier. A pending value or a factory's output is not moved data and stays ``''``."""
    if (
        rt.spmd
        and src._sharding is None
        and src._node is None
        and not src._computed
        and src._uploaded_at is not None
    ):
        src._sharding = TensorSharding(OpSharding.replicated(), tuple(src.shape))
        src._spec_on_ir = True


def _take(
    t: XlaSimTensor, parts: list[Any], inputs: list[Any], wrappers: list[XlaSimTensor], rt: Any
) -> None:
    """Records an xla input: its IR value (pending node or device-data key) and its hash."""
    if t._rt is not rt:
        raise _foreign(t, rt)
    if t._copied is not None:
        _check_copy_fresh(t)
    if t._on_host:
        upload_deferred(t, rt)
    node = t._node
    if node is None:
        entry = _leaf_entry(t)
        inputs.append(entry[1])
        parts.append(entry[2])
    else:
        inputs.append(node)
        parts.append(node.hash)
    wrappers.append(t)


def _run(info: _OpInfo, args: Any, kwargs: Any) -> Any:
    """Runs an op on the wrapped CPU tensors and gives its results pending IR nodes.

    The node hash covers the op and, in argument order, each xla input's hash and each other
    argument's key; it is built from ints only, so it is the same in every process.
    """
    runtime = _runtime.current()
    if info.cpu_rules is not None:
        check_cpu_inputs(info.op, info.cpu_rules, args, kwargs or {}, XlaSimTensor)
    parts: list[Any] = [info.key]
    inputs: list[Any] = []
    wrappers: list[XlaSimTensor] = []
    cargs = []
    consts = []  # the other arguments, kept for the HLO text (a list of tensors as None)
    numbers: list[Any] | None = None  # Python numbers (and 0-dim CPU tensors) torch_xla moves
    slots = info.scalar_slots
    for i, a in enumerate(args):
        if type(a) is XlaSimTensor:
            if a._buf is not None and a._buf.cleared:
                _check_has_data(a, i == 0 and info.op is _COPY)
            elif i == 0 and info.op is _COPY and a._node is None and runtime.graphs.donors.deleted:
                _overwrite_donated(a, runtime)
            _take(a, parts, inputs, wrappers, runtime)
            cargs.append(a._elem)
        else:
            c = _unwrap_other(a, parts, inputs, wrappers, runtime)
            cargs.append(c)
            consts.append(a if c is a else None)
            if slots and i in slots and _is_number(a):
                numbers = [a] if numbers is None else [*numbers, a]
    facts = (consts, kwargs)
    if runtime.float_storage:
        cargs = [_legacy_scalar(c, runtime.float_storage) for c in cargs]
    if kwargs:
        if slots:
            named = [v for k, v in kwargs.items() if k in slots and _is_number(v)]
            numbers = named if numbers is None else numbers + named
        kwargs = {k: _unwrap_other(v, parts, inputs, wrappers, runtime) for k, v in kwargs.items()}
        if info.generator and kwargs.get("generator") is None:
            kwargs["generator"] = runtime.random_generator()
    elif info.generator:
        kwargs = {"generator": runtime.random_generator()}
    op_checks.check(info.op, tuple(cargs), kwargs)
    try:
        out = info.call(*cargs, **kwargs) if kwargs else info.call(*cargs)
    except RuntimeError as exc:
        message = _errors.translate(info.op, tuple(cargs), exc)
        if message is not None:
            raise RuntimeError(message) from None
        if runtime.dry_run:
            shape_only = dry_run.cannot_compute(info.op, exc)
            if shape_only is not None:
                raise shape_only from None
        raise
    except IndexError as exc:
        # Some ops torch_xla checks itself, raising RuntimeError where CPU torch raises this.
        message = _errors.translate_index_error(info.op, exc)
        if message is not None:
            raise RuntimeError(message) from None
        raise
    base = hash(tuple(parts))
    device = wrappers[0]._device if wrappers else xla_device(runtime.default_device_index)
    if numbers:
        _move_numbers(runtime, numbers, wrappers, device, info.op, args)
    pending = runtime.graphs.pending
    node_inputs = tuple(inputs)
    if type(out) is torch.Tensor:
        for w in wrappers:  # in-place / out= ops hand back their input
            if w._elem is out:
                return _update(w, out, 0, info.op, base, node_inputs, pending, facts)
        shape = out.shape
        node = Node(
            hash((base, 0, shape, _DTYPE_KEYS[out.dtype])),
            info.op,
            node_inputs,
            None,
            facts,
            shape,
        )
        t = _new(out, device, node, runtime)
        pending.append(weakref.ref(t))
        if _graph_limit.ACTIVE:
            _graph_limit.record(node.hash, _graph_limit.node_text(info.op, out))
        return t
    if isinstance(out, (tuple, list)):
        elems = {id(w._elem): w for w in wrappers}
        return type(out)(
            _wrap_output(
                o,
                i,
                info.op,
                base,
                node_inputs,
                device,
                elems.get(id(o)),
                pending,
                runtime,
                (consts, facts[1], i),  # one IR node: the outputs share ``consts``
            )
            if isinstance(o, torch.Tensor)
            else o
            for i, o in enumerate(out)
        )
    return out


# Off while the dynamo bridge runs a compiled program by replaying its graph: torch_xla runs
# the program without its ops' kernels.
_kernels_counted = True


@contextlib.contextmanager
def kernels_uncounted() -> Iterator[None]:
    """Ops run meanwhile count no ``xla::`` kernel counter."""
    global _kernels_counted
    before, _kernels_counted = _kernels_counted, False
    try:
        yield
    finally:
        _kernels_counted = before


def _is_number(a: Any) -> bool:
    t = type(a)
    return (
        t is float
        or t is int
        or (t is torch.Tensor and a.dim() == 0 and a.device.type == "cpu" and not a.is_meta)
    )


def _move_numbers(
    runtime: Any,
    numbers: list[Any],
    wrappers: list[XlaSimTensor],
    device: torch.device,
    op: Any,
    args: Any,
) -> None:
    """The numbers an op took, moved to the devices as torch_xla moves them
    (:mod:`xlasim.runtime.scalar_data`), in the dtype the op computes them in."""
    if runtime.dry_run:
        return
    first = wrappers[0]._elem if wrappers else None
    if op in _CLAMPS and len(numbers) == 1 and first is not None:
        # A clamp given one bound moves the dtype's extreme as the other (measured on
        # torch_xla 2.9: two transfers for ``clamp(min=0.5)``, one for ``clamp_min(0.5)``).
        info = torch.finfo(first.dtype) if first.is_floating_point() else torch.iinfo(first.dtype)
        has_min = len(args) > 1 and args[1] is not None
        numbers = [*numbers, info.max if has_min else info.min]
    for n in numbers:
        value = n.item() if type(n) is torch.Tensor else n
        if first is not None:
            dtype = torch.result_type(first, n)
        elif type(n) is torch.Tensor:
            dtype = n.dtype
        else:
            dtype = torch.get_default_dtype() if type(n) is float else torch.int64
        runtime.scalar_data.use(runtime, value, dtype, device.index or 0)


def _legacy_scalar(value: Any, mode: str) -> Any:
    """A scalar argument as XLA_USE_BF16 uploads it (a wrapped number: a 0-dim CPU tensor)."""
    if type(value) is torch.Tensor and value.dim() == 0 and value.is_floating_point():
        value = value.clone()
        _legacy_bf16.round_in_place(value, mode)
        return value
    return _legacy_bf16.round_scalar(value, mode)


# Set once a manual-sharded value exists: until then no op looks for per-device values.
_MANUAL_SEEN = False


def _any_manual(args: Any, kwargs: dict[str, Any] | None) -> bool:
    for a in itertools.chain(args, (kwargs or {}).values()):
        if type(a) is XlaSimTensor and a._manual is not None:
            return True
        if (type(a) is list or type(a) is tuple) and any(
            type(x) is XlaSimTensor and x._manual is not None for x in a
        ):
            return True
    return False


def make_manual(t: XlaSimTensor, values: list[torch.Tensor]) -> XlaSimTensor:
    """Gives ``t`` one value per device (``values[0]`` must be its ``_elem``)."""
    global _MANUAL_SEEN
    _MANUAL_SEEN = True
    t._manual = values
    return t


def _device_arg(a: Any, d: int, op: Any) -> Any:
    """Argument ``a`` as device ``d`` sees it inside a manual region."""
    if type(a) is XlaSimTensor:
        if a._manual is not None:
            return a._manual[d]
        if a._sharding is not None and not a._sharding.is_replicated:
            raise NotImplementedError(
                f"xlasim: {op} mixes a manual-sharded tensor with one sharded "
                f"{a._sharding.spec_string()}; only replicated tensors (the same value on "
                f"every device) can join a manual region in the simulator"
            )
        return a._elem
    if type(a) is list or type(a) is tuple:
        return type(a)(_device_arg(x, d, op) for x in a)
    if isinstance(a, torch.device) and a.type == "xla":
        return _CPU
    return a


def _leaves_device(op: Any, args: Any, kwargs: dict[str, Any]) -> bool:
    if op is aten._local_scalar_dense.default:
        return True
    if op is aten._to_copy.default:
        target = _to_device_target(kwargs)
        return target is not None and target.type != "xla"
    if op is aten.copy_.default:
        return not all(type(a) is XlaSimTensor for a in args[:2])
    return False


def _run_per_device(info: _OpInfo, args: Any, kwargs: dict[str, Any]) -> Any:
    """An op on manual-sharded values: one IR node (as in torch_xla), computed on every
    device's own values; the results are manual too."""
    op = info.op
    if info.handler is _layout_view and not _views_as_is(op, args, kwargs):
        return _mark_copied(_run_per_device(_copying_info(op), args, kwargs), args[0], op)
    if _leaves_device(op, args, kwargs):
        raise NotImplementedError(
            "xlasim: moving a manual-sharded tensor between the host and the devices; its "
            "devices hold different values until xs.disable_manual_sharding (or "
            "_spmd_shard_to_full_shape) makes it one tensor again, which torch_xla needs too "
            "(it aborts the process there)"
        )
    if info.generator:
        raise NotImplementedError(f"xlasim: random op {op} on a manual-sharded tensor")
    if _graph.RECORD_CALLS:
        raise NotImplementedError(
            "xlasim: manual sharding with a real compiler (compiler='libtpu' or a dry run)"
        )
    if info.identity:
        out = _identity(info, args[0])
        return make_manual(out, [out._elem, *(info.call(v) for v in args[0]._manual[1:])])
    if op._schema.is_mutable:
        first = args[0] if args else None
        if not (type(first) is XlaSimTensor and first._manual is not None):
            raise NotImplementedError(
                f"xlasim: in-place {op} writes manual-sharded values into a tensor that is "
                f"not manual-sharded"
            )
    lists = (a for a in itertools.chain(args, kwargs.values()) if type(a) in (list, tuple))
    manual = next(
        a._manual
        for a in itertools.chain(args, kwargs.values(), *lists)
        if type(a) is XlaSimTensor and a._manual is not None
    )
    out = _run(info, args, kwargs)  # the first device's values, and the node
    per_device = [out]
    for d in range(1, len(manual)):
        d_args = [_device_arg(a, d, op) for a in args]
        d_kwargs = {k: _device_arg(v, d, op) for k, v in kwargs.items()}
        per_device.append(info.call(*d_args, **d_kwargs))
    if type(out) is XlaSimTensor:
        make_manual(out, [out._elem, *per_device[1:]])
    elif isinstance(out, (tuple, list)):
        for i, o in enumerate(out):
            if type(o) is XlaSimTensor:
                make_manual(o, [o._elem, *(r[i] for r in per_device[1:])])
    if op is aten.clone.default:
        out._sharding = args[0]._sharding
    return out


class _StableIds(dict):
    """``stable_id`` as a dict lookup (no Python call once a key has been seen)."""

    def __missing__(self, key: Any) -> int:
        value = self[key] = stable_id(key)
        return value


_DTYPE_KEYS = _StableIds()


def _update(
    w: XlaSimTensor, o: torch.Tensor, index, func, base, inputs, pending, facts=None
) -> XlaSimTensor:
    """An in-place / out= result: the input tensor gets the new pending node."""
    if _COPIES_SEEN:
        _count_write(o)
    if w._rt.float_storage:
        _legacy_bf16.round_in_place(o, w._rt.float_storage)
    if w._rt.long_storage:
        _legacy_long.wrap_in_place(o)
    if w.shape != o.shape:
        set_wrapper_shape(w, o.shape)
        w._leaf = None
    if w._node is None:
        w._aliased = True
    shape = o.shape
    w._node = Node(
        hash((base, index, shape, _DTYPE_KEYS[o.dtype])), func, inputs, None, facts, shape
    )
    # torch_xla's functionalization keeps an in-place result on its tensor's sharding with a
    # custom-sharding node over it; not in eager mode, and not for an op XLAShardedTensor
    # re-dispatches (under no_dispatch, which skips that step).
    if w._sharding is not None and not _no_functionalization and not w._rt.graphs.use_eager_mode:
        add_custom_sharding(w, "Sharding", w._sharding, tuple(o.shape))
        w._rt.metrics.inc("SetShardingSpec")  # the result keeps the tensor's spec
    pending.append(weakref.ref(w))
    if _graph_limit.ACTIVE:
        _graph_limit.record(w._node.hash, _graph_limit.node_text(func, o))
    return w


def add_custom_sharding(t: XlaSimTensor, target: str, spec: Any, shape: tuple[int, ...]) -> None:
    """Puts torch_xla's ``CustomSharding`` IR node over ``t``'s value (pending IR, or the
    data it holds). While ops are recorded for a compiler, which replays aten ops only, the
    node is left out (the HLO text then refuses the graph)."""
    if _graph.RECORD_CALLS:
        return
    value, value_hash = _ir_value(t)
    parts: list[Any] = [_CUSTOM_KEY, stable_id(target), value_hash]
    if isinstance(spec, TensorSharding):
        parts.append(stable_id(spec.op.to_string()))
    elif spec is not None:
        parts.append(stable_id(spec))
    node = Node(
        hash((hash(tuple(parts)), 0, shape, _DTYPE_KEYS[t.dtype])),
        "xla::custom_sharding",
        (value,),
        None,
        CustomCall(target, spec, shape),
        shape,
    )
    if target == "Sharding" and type(spec) is TensorSharding:
        # Consumers see the annotation (propagation starts from it); one only XLA could
        # derive (an UnderivedSharding) tells them nothing.
        node.sharding = spec
    t._node = node


_CUSTOM_KEY = stable_id("xla::custom_sharding")
_BARRIER_KEY = stable_id("xla::optimization_barrier")


def add_optimization_barrier(tensors: list[XlaSimTensor]) -> None:
    """``xm.optimization_barrier_``: one IR node over the tensors' values whose outputs
    become their values (the values are unchanged). While ops are recorded for a compiler,
    which replays aten ops only, it is left out (the HLO text then refuses the graph)."""
    if _graph.RECORD_CALLS or not tensors:
        return
    rt = owned(tensors[0])
    parts: list[Any] = [_BARRIER_KEY]
    inputs: list[Any] = []
    for t in tensors:
        _take(t, parts, inputs, [], rt)
    base = hash(tuple(parts))
    consts: list[Any] = []  # shared by the outputs: they are one IR node
    node_inputs = tuple(inputs)
    for index, t in enumerate(tensors):
        if t._node is None:
            t._aliased = True  # data given a new IR value in place, as an in-place op does
        t._node = Node(
            hash((base, index, t.shape, _DTYPE_KEYS[t.dtype])),
            "xla::optimization_barrier",
            node_inputs,
            None,
            (consts, None, index),
            t.shape,
        )
        rt.graphs.pending.append(weakref.ref(t))
    if _graph.EAGER_SEEN and rt.graphs.use_eager_mode:
        # eager mode runs the barrier at once, a graph per tensor as each gets its new value
        # (measured on torch_xla 2.9: two tensors, two EagerOpCompileTime samples, and two
        # more EagerOpExecuteTime ones but no compile when the barrier is repeated)
        for t in tensors:
            _run_eagerly(rt.graphs, t)


_no_functionalization = False


@contextlib.contextmanager
def without_functionalization() -> Iterator[None]:
    """Ops run inside see no functionalization step (as XLAShardedTensor's re-dispatch)."""
    global _no_functionalization
    before = _no_functionalization
    _no_functionalization = True
    try:
        yield
    finally:
        _no_functionalization = before


def leaf_input(t: XlaSimTensor) -> Any:
    """The value a graph records for device-data tensor ``t`` (one per buffer and sharding)."""
    return _leaf_entry(t)[1]


def _wrap_output(o, index, func, base, inputs, device, existing, pending, rt, facts=None):
    if existing is not None:  # in-place / out= ops hand back their input
        return _update(existing, o, index, func, base, inputs, pending, facts)
    shape = o.shape
    node = Node(hash((base, index, shape, _DTYPE_KEYS[o.dtype])), func, inputs, None, facts, shape)
    t = _new(o, device, node, rt)
    pending.append(weakref.ref(t))
    return t


def _run_eagerly(graphs: Any, out: Any) -> None:
    """Eager mode: the op's results run now, as a graph of their own."""
    outputs = out if isinstance(out, (tuple, list)) else (out,)
    pending = [o for o in outputs if type(o) is XlaSimTensor and o._node is not None]
    if pending:
        graphs.execute(pending, sync_all=False, spmd=_runtime.current().spmd, eager=True)


def _cpu_fallback(info: _OpInfo, counter: str, args: Any, kwargs: dict[str, Any]) -> Any:
    """An op torch_xla does not lower: its CPU fallback. The xla inputs are computed (one
    graph) and copied to the host, the op runs there, and its results are device tensors whose
    values wait on the host until their first use (an out= or in-place argument included)."""
    runtime = _runtime.current()
    runtime.metrics.inc(counter)
    flat, spec = torch.utils._pytree.tree_flatten((args, kwargs))
    xla_inputs = [a for a in flat if type(a) is XlaSimTensor]
    materialize(xla_inputs)  # checks each input belongs to this runtime
    start = time.perf_counter_ns()
    on_device = [t for t in xla_inputs if not t._on_host]
    if on_device:
        runtime.metrics.from_device(sum(_nbytes(t._elem) for t in on_device), start)
    cpu_args, cpu_kwargs = torch.utils._pytree.tree_unflatten(
        [a._elem if type(a) is XlaSimTensor else a for a in flat], spec
    )
    out = info.call(*cpu_args, **cpu_kwargs)
    device = xla_inputs[0]._device if xla_inputs else None
    by_value = {id(t._elem): t for t in xla_inputs}

    def back(o: Any) -> Any:
        if not isinstance(o, torch.Tensor):
            return o
        t = by_value.get(id(o))
        if t is None:
            t = wrap_data(o, device)
        t._node, t._sharding, t._leaf = None, None, None
        t._on_host, t._computed, t._uploaded_at = True, False, None
        t._moved_at = runtime.step_barriers if runtime.spmd else None
        return t

    if isinstance(out, (tuple, list)):
        return type(out)(back(o) for o in out)
    return back(out)


def _run_op(func: Any, args: Any, kwargs: Any) -> Any:
    """``_run`` for a handler that falls back to the ordinary path."""
    if _graph.RECORD_CALLS:
        return _run_recorded(_op_info(func), args, kwargs)
    return _run(_op_info(func), args, kwargs)


def device_index(runtime: Any, device: torch.device | None) -> int:
    """The ordinal a tensor made for ``device`` lands on; torch_xla's error if none such."""
    if device is None or device.index is None:
        return int(runtime.default_device_index)
    index = device.index
    client = runtime.client
    count = 1 if runtime.spmd else client.num_local
    if index >= count:
        valid = (
            "xla:0 (one virtual device under SPMD)" if runtime.spmd else f"xla:0..xla:{count - 1}"
        )
        where = (
            runtime.describe()
            if client.is_tpu
            else f"the PJRT {client.device_type} client (PJRT_DEVICE, CPU_NUM_DEVICES)"
        )
        raise torch_xla_error(
            RuntimeError,
            f"vector::_M_range_check: __n (which is {index}) >= this->size() (which is {count})",
            f"device xla:{index} does not exist: this process has {count} xla device(s), "
            f"{valid}, on {where}",
        )
    return index


def _run_recorded(info: _OpInfo, args: Any, kwargs: Any) -> Any:
    """``_run``, keeping the op's arguments on its output nodes so a compiler can replay the
    graph (only while ``RECORD_CALLS`` is on: it costs a second walk over the arguments).

    Each xla argument becomes an ``InputRef`` to its position in ``Node.inputs``, numbered in
    the order ``_run`` records them (positional, then keyword arguments); device data also
    keeps a weak reference to the tensor and the sharding it has now, before the op runs.
    """
    count = 0

    def ref(a: Any) -> Any:
        nonlocal count
        if type(a) is XlaSimTensor:
            leaf = weakref.ref(a) if a._node is None else None
            count += 1
            return InputRef(count - 1, leaf, a._sharding)
        if (type(a) is list or type(a) is tuple) and a and isinstance(a[0], torch.Tensor):
            return type(a)(ref(x) for x in a)  # the lists _run takes tensors from
        return a

    recorded_args = tuple(ref(a) for a in args)
    recorded_kwargs = {k: ref(v) for k, v in (kwargs or {}).items()}
    out = _run(info, args, kwargs)
    outputs = out if isinstance(out, (tuple, list)) else (out,)
    for index, o in enumerate(outputs):
        if type(o) is XlaSimTensor and o._node is not None:
            # One args tuple for all outputs of the call: a replay runs the op once.
            o._node.call = RecordedCall(recorded_args, recorded_kwargs, index)
    return out


def derived(
    src: XlaSimTensor, value: torch.Tensor, op: str, key: Any = 0, args: Any = None
) -> XlaSimTensor:
    """A pending result of IR op ``op`` (one of torch_xla's own nodes, not an aten op) on
    ``src``, with ``key`` (ints) covering its other attributes in the graph hash and ``args``
    what its HLO text needs (``Node.args``)."""
    runtime = owned(src)
    parts: list[Any] = [stable_id(op), key]
    inputs: list[Any] = []
    _take(src, parts, inputs, [], runtime)
    node = Node(
        hash((hash(tuple(parts)), 0, value.shape, _DTYPE_KEYS[value.dtype])),
        op,
        tuple(inputs),
        None,
        args,
        value.shape,
    )
    t = _new(value, src._device, node, runtime)
    runtime.graphs.pending.append(weakref.ref(t))
    return t


def user_computation(
    srcs: list[XlaSimTensor], values: list[torch.Tensor], op: str, key: int
) -> list[XlaSimTensor]:
    """The pending results of one user-computation IR node ``op`` (torch_xla's
    ``xla::_op_<name>``) over ``srcs``, one per output value; ``key`` stands for the
    computation in the graph hash."""
    if not srcs:
        raise RuntimeError(f"{op}: a user computation needs at least one XLA tensor input")
    runtime = owned(srcs[0])
    parts: list[Any] = [stable_id(op), key]
    inputs: list[Any] = []
    for src in srcs:
        _take(src, parts, inputs, [], runtime)
    base = hash(tuple(parts))
    outs = []
    for index, value in enumerate(values):
        shape = value.shape
        node = Node(
            hash((base, index, shape, _DTYPE_KEYS[value.dtype])),
            op,
            tuple(inputs),
            None,
            None,
            shape,
        )
        t = _new(value, srcs[0]._device, node, runtime)
        runtime.graphs.pending.append(weakref.ref(t))
        outs.append(t)
    return outs


def wrap_data(
    elem: torch.Tensor, device: torch.device | None, sharding: Any = None, allocate: bool = True
) -> XlaSimTensor:
    """A device-data tensor (no pending IR), as a host-to-device transfer produces, with
    ``sharding`` (a ``TensorSharding``) if given.

    ``allocate=False`` leaves it without a buffer for the caller to place: a transfer with an
    input sharding lands as shards, never whole on one device first.
    """
    runtime = _runtime.current()
    if runtime.dry_run:
        elem = dry_run.shape_only(elem)
    if not runtime.client_initialized:
        runtime.start()  # the first device buffer starts the runtime
    index = device_index(runtime, device)
    runtime.devices_used = True
    t = _new(elem, xla_device(index), None, runtime)
    t._sharding = sharding
    if allocate:
        memory.settle(runtime, t)
    return t


def reserve_factory(size: Any, dtype: torch.dtype | None, device: torch.device | None) -> None:
    """Before a factory allocates: the device must exist and the tensor must fit its HBM."""
    runtime = _runtime.current()
    index = device_index(runtime, device)
    memory.reserve(runtime, _dynamic_dims.bounds(size), dtype or torch.get_default_dtype(), index)


def _foreign(t: XlaSimTensor, runtime: Any) -> RuntimeError:
    owner = t._rt
    where = owner.describe() if owner is not None else "another simulated slice"
    return RuntimeError(
        f"xlasim: this {t.device} tensor (shape {list(t.shape)}, {t.dtype}) was made on the "
        f"simulated slice {where}, not on the active one ({runtime.describe()}); every "
        f"xlasim.simulate() entry is a process of its own and tensors cannot cross between "
        f"them: copy it to the CPU (t.cpu()) inside the simulation that made it"
    )


def owned(t: XlaSimTensor) -> Any:
    """The active runtime, after checking that ``t`` was made in it."""
    runtime = _runtime.current()
    if t._rt is not runtime:
        raise _foreign(t, runtime)
    if t._copied is not None:
        _check_copy_fresh(t)
    return runtime


def wrap_factory(
    elem: torch.Tensor, device: torch.device | None, sizes: Any = None
) -> XlaSimTensor:
    """A tensor made on the device by a factory op: pending IR, like torch_xla's constants.
    ``sizes``: the sizes asked for, when they may hold dynamic ones (``elem`` has the real
    sizes)."""
    t = wrap_data(elem, device)
    runtime = _runtime.current()
    call = (
        RecordedCall((tuple(elem.shape),), {"dtype": elem.dtype}, 0)
        if _graph.RECORD_CALLS
        else None
    )
    t._node = Node(
        hash((stable_id("factory"), tuple(elem.shape), stable_id(elem.dtype))),
        "aten::empty",
        (),
        call,
        shape=elem.shape,
    )
    graphs = runtime.graphs
    graphs.pending.append(weakref.ref(t))
    if graphs.use_eager_mode:
        # torch_xla runs the new tensor's IR (a constant fill) at once, even when a transfer
        # overwrites it next: a ``.to('xla')`` costs an eager op too.
        graphs.execute([t], sync_all=False, spmd=runtime.spmd, eager=True)
        # Its spec stays unset all the same, so a ``.to('xla')`` reports ``''`` until used
        # (measured on torch_xla 2.9 under SPMD, where a filled factory reports replicated).
        t._sharding = None
    if sizes is not None and any(_dynamic_dims.is_dynamic(d) for d in sizes):
        return with_sizes(t, list(sizes))
    return t


def materialize(
    tensors: list[XlaSimTensor],
    compile_error: type[Exception] = RuntimeError,
    *,
    donate_ltc: bool = False,
) -> None:
    """Runs the graph needed for ``tensors`` only (what ``_to_cpu`` does in torch_xla).

    A graph the real compiler rejects raises ``compile_error`` with its message: RuntimeError
    from aten ops, ValueError from torch_xla's pybind functions. ``donate_ltc``: the buffers of
    tensors updated in place are donated, as at a step barrier (``_xla_sync_multi``).
    """
    for t in tensors:
        owned(t)
        if t._node is None and t._rt.graphs.donors.deleted:
            _check_not_donated(t)
    if any(t._node is not None for t in tensors):
        runtime = _runtime.current()
        try:
            runtime.graphs.execute(
                tensors, sync_all=False, spmd=runtime.spmd, donate_ltc=donate_ltc
            )
        except CompileError as exc:
            raise compile_error(str(exc)) from None


def _check_not_donated(t: XlaSimTensor) -> None:
    """Reading data whose buffer a graph was given (``_set_buffer_donation``) fails as in
    torch_xla; the tensor ID is the simulator's own numbering."""
    if t._rt.graphs.donors.deleted_on(leaf_input(t)) is not None:
        raise RuntimeError(
            f"Check failed: handle->HasValue(): Trying to access XLA data for tensor with ID "
            f"{t._seq} while an async operation is in flight: UNKNOWN_SCALAR[]"
        )


def _to_device_target(kwargs: dict[str, Any]) -> torch.device | None:
    dev = kwargs.get("device")
    return torch.device(dev) if dev is not None else None


def _to_copy(func, args, kwargs):
    src = args[0]
    target = _to_device_target(kwargs)
    cpu_kwargs = {k: v for k, v in kwargs.items() if k != "device"}
    if target is not None and target.type != "xla":
        # Device to host: runs the pending graph first, then transfers.
        runtime = _runtime.current()
        materialize([src])
        if runtime.dry_run:
            raise dry_run.needs_values(f"copying a device tensor to {target.type}")
        start = time.perf_counter_ns()
        if cpu_kwargs.get("memory_format") in (None, torch.preserve_format):
            # The host copy is laid out as the device tensor reports itself: row-major.
            cpu_kwargs["memory_format"] = torch.contiguous_format
        out = aten._to_copy.default(src._elem, **cpu_kwargs)
        if target.type != "cpu":
            out = out.to(target)
        _count_gather(runtime, src)
        runtime.metrics.from_device(_nbytes(src._elem), start)
        return out
    if target is not None and target.index is not None and target.index != src.device.index:
        # Device to device copy: a new device-data tensor on the other device.
        device_index(owned(src), target)
        materialize([src])
        return wrap_data(aten._to_copy.default(src._elem, **cpu_kwargs), target)
    return _run_op(func, args, kwargs)


def _copy_(func, args, kwargs):
    dst, src = args[0], args[1]
    if isinstance(dst, XlaSimTensor) and not isinstance(src, XlaSimTensor):
        # Host to device transfer into an existing device tensor: it becomes device data.
        runtime = owned(dst)
        if _COPIES_SEEN:
            _count_write(dst._elem)
        start = time.perf_counter_ns()
        dst._elem.copy_(src, **kwargs)
        if runtime.float_storage:
            _legacy_bf16.round_in_place(dst._elem, runtime.float_storage)
        if runtime.long_storage:
            _legacy_long.wrap_in_place(dst._elem)
        dst._node = None
        if runtime.spmd:
            # torch_xla keeps the data on the host until it is sharded or used.
            dst._on_host, dst._computed = True, False
            dst._moved_at = runtime.step_barriers
        else:
            runtime.metrics.to_device(_nbytes(dst._elem), start)
            mark_uploaded(dst, runtime)
        memory.settle(runtime, dst)
        return dst
    if not isinstance(dst, XlaSimTensor):
        materialize([src])
        if src._elem.is_meta:
            raise dry_run.needs_values(f"copying a device tensor into a {dst.device.type} tensor")
        dst.copy_(src._elem, **kwargs)
        return dst
    if _takes_data_of(dst, src):
        # torch_xla gives ``dst`` the IR value of ``src``: its device data, which is no
        # pending computation (a sync runs nothing for it). The values are copied, as the
        # simulator's ops write into a tensor's own values in place.
        runtime = owned(dst)
        owned(src)
        dst._elem.copy_(src._elem)
        dst._node, dst._leaf, dst._aliased = None, None, False
        dst._computed, dst._uploaded_at = src._computed, src._uploaded_at
        memory.settle(runtime, dst)
        return dst
    out = _run_op(func, args, kwargs)
    if isinstance(src, XlaSimTensor):
        _replicate_moved(src, src._rt)
        if src._sharding is not None:
            # The destination takes a sharded source's spec; an unsharded one leaves its own.
            out._sharding = src._sharding
    return out


def _takes_data_of(dst: XlaSimTensor, src: Any) -> bool:
    """Whether ``dst.copy_(src)`` leaves ``dst`` holding ``src``'s device data as it is
    (measured on torch_xla 2.9 CPU: a sync after it runs nothing): ``src`` is device data of
    the same dtype and shape, neither is a view, both are unsharded and off SPMD (where the
    copy's sharding rules apply)."""
    return (
        type(src) is XlaSimTensor
        and src._node is None
        and src.dtype == dst.dtype
        and src.shape == dst.shape
        and not src._on_host
        and not (src._buf is not None and src._buf.cleared)
        and src._sharding is None
        and dst._sharding is None
        and src._manual is None
        and dst._manual is None
        and src._copied is None
        and dst._copied is None
        and dst._slice_root is None
        and not dst._elem._is_view()
        and not src._rt.spmd
    )


def _local_scalar_dense(func, args, kwargs):
    src = args[0]
    runtime = _runtime.current()
    materialize([src])
    if runtime.dry_run:
        raise dry_run.needs_values(
            "reading a device tensor's value (.item(), bool(), int(), float(), an if on it)"
        )
    # torch_xla has no lowering for it: it is a CPU fallback, counted as such.
    runtime.metrics.inc("aten::_local_scalar_dense")
    start = time.perf_counter_ns()
    value = func(src._elem)
    _count_gather(runtime, src)
    runtime.metrics.from_device(_nbytes(src._elem), start)
    return value


def _count_gather(runtime: Any, src: XlaSimTensor) -> None:
    """Under SPMD, reading device data back gathers it from the devices' buffers (replicated
    ones too); data that never left the host (no sharding yet) is read as it is.  Tiled data
    is gathered by a replicating program that PJRT compiles (uncached) and runs for each read
    (measured on torch_xla 2.9: one ``CompileTime`` and one ``ExecuteReplicatedTime`` per
    ``.cpu()`` of a tiled tensor, none for a replicated one)."""
    if runtime.spmd and src._sharding is not None:
        metrics = runtime.metrics
        metrics.inc("ReplicateShardedData")
        if src._sharding.op.proto_type == ProtoType.OTHER:
            start = time.perf_counter_ns()
            metrics.add_sample("CompileTime", time.perf_counter_ns() - start)
            metrics.inc("CreateCompileHandles")
            metrics.add_sample("ExecuteReplicatedTime", time.perf_counter_ns() - start)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _clone(func, args, kwargs):
    src = args[0]
    rt = owned(src)
    if src._on_host:
        upload_deferred(src, rt)  # a use, as for any op
    _replicate_moved(src, rt)
    if _graph.RECORD_CALLS:
        # A compiler replays the recorded aten ops: it needs the clone's memory format (a
        # ``contiguous()`` before a view), so the clone stays a node there.
        out = _run_op(func, args, kwargs)
        out._sharding = src._sharding
        return out
    # torch_xla's clone is a new tensor on its source's IR value (no node: the graph and an
    # eager-mode run see nothing), with its source's sharding spec, data or annotation alike;
    # writes to either one later give it a value of its own.
    return _identity(_op_info(func), src, kwargs)  # memory_format: the wrapper's strides


# Set once a view has been computed as a copy (``_layout_view``): until then no op looks for
# copies among its inputs' sources.
_COPIES_SEEN = False


def _layout_view(func, args, kwargs):
    """``view`` (and the ops like it that need a layout of their values, not only a shape).

    A device tensor reports row-major strides whatever it is, so PyTorch asks for a view
    wherever the shape allows it (``x.t().contiguous().view(-1)``: ``contiguous()`` keeps
    ``x.t()``), and torch_xla gives one. The CPU values of a transposed tensor cannot be viewed
    so; they are viewed as their row-major copy, which stays a view in the graph (the same IR
    as torch_xla's) and refuses what would tell the two apart: a write into either one after.
    """
    if _views_as_is(func, args, kwargs):
        return _run_op(func, args, kwargs)
    info = _copying_info(func)
    out = _run_recorded(info, args, kwargs) if _graph.RECORD_CALLS else _run(info, args, kwargs)
    return _mark_copied(out, args[0], func)


def _slice(func, args, kwargs):
    """``slice``: torch_xla keeps the tensor the chain of slices started from on the result
    (``as_strided`` reads against it)."""
    out = _run_op(func, args, kwargs)
    src = args[0]
    out._slice_root = src._slice_root if src._slice_root is not None else src
    return out


def _as_strided(func, args, kwargs):
    """``as_strided`` as torch_xla reads it (:mod:`xlasim.runtime.strided`): against the
    row-major values of its input's slice root, or of the input itself, computed on them.

    The result is a view of the input's CPU values only where torch_xla's write into it
    lands where the CPU's does: strides that cover consecutive elements, read from the
    input's own values laid out row-major. Elsewhere it is held as a copy (``_mark_copied``:
    writes into it are refused, a write into its source makes it stale), as torch_xla writes
    elsewhere than it read (measured: other strides write the values back as consecutive
    elements; a slice's write lands in the slice at the offset its root was read at)."""
    src = args[0]
    offset = args[3] if len(args) > 3 else kwargs.get("storage_offset")
    root = src._slice_root if src._slice_root is not None else src
    call = (root, args[1], args[2], offset or 0)  # an xla tensor's storage offset is 0
    out = _run_recorded(_STRIDED, call, {}) if _graph.RECORD_CALLS else _run(_STRIDED, call, {})
    out._slice_root = root
    if (
        root is not src
        or not root._elem.is_contiguous()
        or not _strided.non_overlapping_and_dense(args[1], args[2])
    ):
        _mark_copied(out, root, func)
    return out


def _views_as_is(func: Any, args: Any, kwargs: Any) -> bool:
    """Whether view op ``func`` can view the CPU values of its input as they are laid out."""
    elem = args[0]._elem
    if elem.is_contiguous():
        return True
    try:
        func(elem, *args[1:], **kwargs)
    except RuntimeError:
        return False
    return True


def _copying_info(func: Any) -> _OpInfo:
    """``func`` computed on a row-major copy of its input's values."""
    info = _COPYING_VIEWS.get(func)
    if info is None:
        op_call = getattr(func, "_op", func)
        info = _OpInfo(func)
        info.handler = None
        info.call = lambda value, *rest, **kw: op_call(value.contiguous(), *rest, **kw)
        _COPYING_VIEWS[func] = info
    return info


def _mark_copied(out: XlaSimTensor, src: XlaSimTensor, func: Any) -> XlaSimTensor:
    global _COPIES_SEEN
    source = src._elem
    if not source.is_meta:  # a dry run's values are shapes only: nothing to keep in step
        storage = source.untyped_storage().data_ptr()
        writes = _WATCHED[storage][0] if storage in _WATCHED else 0
        _hold_copy(out, (source, storage, writes, func.overloadpacket.__name__))
        _COPIES_SEEN = True
    return out


_COPYING_VIEWS: dict[Any, _OpInfo] = {}


# The storages that copied views were taken from (each kept alive by its views, so its
# address names it): writes into it so far, and how many device tensors hold such a copy.
# Counted here because the simulator's in-place ops run below autograd, where CPU tensors
# count no versions; a storage leaves once no copy of it is held, so the table stays small.
_WATCHED: dict[int, list[int]] = {}


def _hold_copy(t: XlaSimTensor, copied: tuple[torch.Tensor, int, int, str]) -> None:
    storage = copied[1]
    _WATCHED.setdefault(storage, [0, 0])[1] += 1
    weakref.finalize(t, _release_copy, storage)
    t._copied = copied


def _release_copy(storage: int) -> None:
    entry = _WATCHED.get(storage)
    if entry is not None:
        entry[1] -= 1
        if entry[1] <= 0:
            del _WATCHED[storage]


def _count_write(value: torch.Tensor) -> None:
    if not value.is_meta:
        entry = _WATCHED.get(value.untyped_storage().data_ptr())
        if entry is not None:
            entry[0] += 1


def _keep_written(info: _OpInfo, args: Any, kwargs: Any) -> None:
    """Before an op writes into device-data tensors: their keys keep the values they had."""
    for index, name in info.written:
        a = args[index] if index < len(args) else (kwargs or {}).get(name)
        if type(a) is XlaSimTensor and a._node is None and a._leaf is not None:
            data_keys.before_write(a._leaf[1], a)


def _count_written(info: _OpInfo, args: Any, kwargs: Any) -> None:
    """Counts a write into each argument op ``info`` writes (before it writes: a count only
    has to differ from the one a copy was taken at)."""
    for index, name in info.written:
        a = args[index] if index < len(args) else (kwargs or {}).get(name)
        if type(a) is XlaSimTensor:
            _count_write(a._elem)


def note_write(t: XlaSimTensor) -> None:
    """Before ``t``'s CPU values are written in place off the op path (shards loaded into
    them): a copied view taken from them counts as stale after."""
    if _COPIES_SEEN:
        _count_write(t._elem)


def replace_values(t: XlaSimTensor, value: torch.Tensor) -> None:
    """Gives ``t`` new CPU values (a reshard assembling them from the hosts): a copied view
    taken from the old ones can no longer see the tensor's writes, so it counts as stale."""
    note_write(t)
    t._elem = value


def _inherit_copy(src: Any, out: Any) -> None:
    """A view of a copied view holds (part of) the same copy."""
    copied = getattr(src, "_copied", None)
    if copied is None:
        return
    for o in out if isinstance(out, (tuple, list)) else (out,):
        if type(o) is XlaSimTensor and o._copied is None:
            _hold_copy(o, copied)


def _check_copy_fresh(t: XlaSimTensor) -> None:
    _, storage, writes, op = t._copied  # type: ignore[misc]
    if _WATCHED.get(storage, (writes,))[0] != writes:
        raise NotImplementedError(
            f"xlasim: this tensor is {op}() of a tensor whose values are laid out otherwise "
            f"(a transposed or permuted one, or, for as_strided, the tensor a slice was taken "
            f"from), and that tensor has been written in place since; "
            f"torch_xla keeps the two views of one value, so this one shows the write, while "
            f"the simulator holds a copy taken before it. Take the {op}() after the write, "
            f"or clone() the tensor before it"
        )


def _refuse_copy_writes(info: _OpInfo, args: Any, kwargs: Any) -> None:
    """Before an op writes into its arguments: none of them may be a copied view."""
    for index, name in info.written:
        a = args[index] if index < len(args) else (kwargs or {}).get(name)
        if type(a) is XlaSimTensor and a._copied is not None:
            raise _copy_written(a, info.op)


def _copy_written(t: XlaSimTensor, op: Any) -> NotImplementedError:
    source_op = t._copied[3]  # type: ignore[index]
    return NotImplementedError(
        f"xlasim: in-place {op} on {source_op}() of a tensor whose values are laid out "
        f"otherwise (a transposed or permuted one, or, for as_strided, the tensor a slice was "
        f"taken from): torch_xla keeps the two views of one value, so the write changes both, "
        f"while the simulator holds a copy and cannot pass the write on. clone() the view to "
        f"write into a tensor of its own"
    )


def _class_index_target(func, args, kwargs, at: int):
    """``nll_loss`` with a floating-point target, as XLA's lowering takes it: each sample picks
    the class whose index equals its target value, so a non-integral value picks none (that
    sample weighs nothing, as an ignored one does); eager CPU refuses such targets."""
    target = args[at]
    if not (isinstance(target, XlaSimTensor) and target.dtype.is_floating_point):
        return _run_op(func, args, kwargs)
    ignore_index = args[at + 3]
    picked = torch.where(target == target.trunc(), target, ignore_index).long()
    return _run_op(func, (*args[:at], picked, *args[at + 1 :]), kwargs)


def _nll_forward(func, args, kwargs):
    return _class_index_target(func, args, kwargs, 1)


def _nll_backward(func, args, kwargs):
    return _class_index_target(func, args, kwargs, 2)


_MASK_DTYPES = (torch.bool, torch.uint8)


def _masked_indices(func, args, kwargs):
    """``index``/``index_put`` with a boolean mask among the indices. ATen turns a mask into
    the integer indices of its true elements before torch_xla's kernel sees it, through
    ``nonzero``, which torch_xla runs on its CPU fallback (the mask's graph runs first, the
    call counts ``aten::nonzero``); the op then indexes with those integers, as here."""
    self, indices = args[0], args[1]
    if not any(isinstance(i, torch.Tensor) and i.dtype in _MASK_DTYPES for i in indices):
        return _run_op(func, args, kwargs)
    expanded: list[Any] = []
    dim = 0
    for index in indices:
        if not (isinstance(index, torch.Tensor) and index.dtype in _MASK_DTYPES):
            expanded.append(index)
            dim += 1
            continue
        if dim + index.dim() > self.dim():
            return _run_op(func, args, kwargs)  # PyTorch's own error: too many indices
        for j, size in enumerate(index.shape):
            if size != self.shape[dim + j]:
                raise _mask_misfit(index, j, self, dim + j)
        expanded.extend(index.nonzero().unbind(1))
        dim += index.dim()
    return func(self, expanded, *args[2:], **kwargs)


def _mask_misfit(mask: torch.Tensor, j: int, self: torch.Tensor, at: int) -> RuntimeError:
    """torch_xla's check of a mask against the dims it indexes (its message, verbatim)."""
    return RuntimeError(
        f"Check failed: index->size(j) == self.size(src_idx) ({mask.shape[j]} vs. "
        f"{self.shape[at]})The shape of the mask {list(mask.shape)} at index {j} does not "
        f"match the shape of the indexed tensor {list(self.shape)} at index {at}"
    )


def _native_batch_norm(func, args, kwargs):
    """torch_xla moves the running variance towards the batch's *biased* variance (the one
    XLA's BatchNormTraining gives, on every device), where PyTorch's kernel (and so the CPU op
    the simulator runs) uses the unbiased one; the output and saved statistics agree."""
    names = ("input", "weight", "bias", "running_mean", "running_var", "training", "momentum")
    given = dict(zip(names, args, strict=False)) | {k: v for k, v in kwargs.items() if k in names}
    running_var = given.get("running_var")
    if not given.get("training") or not isinstance(running_var, XlaSimTensor):
        return _run_op(func, args, kwargs)
    before = running_var._elem.clone()
    out = _run_op(func, args, kwargs)
    x = given["input"]._elem
    momentum = given["momentum"]
    batch_var = x.var(dim=[d for d in range(x.dim()) if d != 1], unbiased=False)
    running_var._elem.copy_(batch_var * momentum + before * (1 - momentum))
    stats = [t for t in (given.get("running_mean"), running_var) if type(t) is XlaSimTensor]
    first = out[0]
    if type(first) is not XlaSimTensor or first._node is None:  # recorded for a compiler
        if _COPIES_SEEN:  # the schema marks no argument written: the statistics count here
            for stat in stats:
                _count_write(stat._elem)
        return out
    # The statistics become pending values of the same graph (real torch_xla 2.9: a
    # ``xla::moving_average`` node over the batch's statistics), so a step computes them
    # with the output; eager mode runs the op's outputs and both statistics as one graph.
    node = first._node
    stat_runtime = first._rt
    for index, stat in enumerate(stats, start=len(out)):
        _update(stat, stat._elem, index, func, node.hash, node.inputs, stat_runtime.graphs.pending)
    graphs = stat_runtime.graphs
    if _graph.EAGER_SEEN and graphs.use_eager_mode:
        computed = [t for t in (*out, *stats) if type(t) is XlaSimTensor and t._node is not None]
        graphs.execute(computed, sync_all=False, spmd=stat_runtime.spmd, eager=True)
    return out


def _allclose(func, args, kwargs):
    """torch_xla has no kernel for ``allclose``: PyTorch's composite kernel runs on the device
    tensors (``isclose``, reduced with ``all``, read with ``item``), so its ops are graph (or
    eager) ops of their own and reading the answer runs them (real torch_xla 2.9 on CPU)."""
    names = ("self", "other", "rtol", "atol", "equal_nan")
    given = dict(zip(names, args, strict=False)) | kwargs
    # Called from here ops skip autograd, where PyTorch decomposes isclose and item: so
    # decomposed here, as they are on their way to torch_xla's kernels.
    close = aten.isclose.default.decompose(
        given["self"],
        given["other"],
        given.get("rtol", 1e-05),
        given.get("atol", 1e-08),
        given.get("equal_nan", False),
    )
    return bool(aten._local_scalar_dense.default(aten.all.default(close)))


def _expand(func, args, kwargs):
    """Without functionalization torch_xla's own expand kernel checks the sizes first."""
    if _unfunctionalized.disabled():
        sizes = args[1] if len(args) > 1 else kwargs["size"]
        message = _unfunctionalized.expand_error(args[0], sizes)
        if message is not None:
            raise RuntimeError(message)
    return _run_op(func, args, kwargs)


_SPECIAL = {
    aten.allclose.default: _allclose,
    aten.expand.default: _expand,
    aten.native_batch_norm.default: _native_batch_norm,
    aten.index.Tensor: _masked_indices,
    aten.index_put.default: _masked_indices,
    aten.index_put_.default: _masked_indices,
    aten._index_put_impl_.default: _masked_indices,
    aten.nll_loss_forward.default: _nll_forward,
    aten.nll_loss_backward.default: _nll_backward,
    aten.nll_loss2d_forward.default: _nll_forward,
    aten.nll_loss2d_backward.default: _nll_backward,
    aten._to_copy.default: _to_copy,
    aten.clone.default: _clone,
    aten.copy_.default: _copy_,
    aten._local_scalar_dense.default: _local_scalar_dense,
    aten.slice.Tensor: _slice,
    aten.as_strided.default: _as_strided,
    aten.view.default: _layout_view,
    aten._unsafe_view.default: _layout_view,
    aten.view.dtype: _layout_view,
    aten.view_as_complex.default: _layout_view,
    aten.view_as_real.default: _layout_view,
    aten.nonzero.default: _dynamic_result,
    aten.masked_select.default: _dynamic_result,
}


# as_strided computed against its input's reference values (the handler picks them).
_STRIDED = _OpInfo(aten.as_strided.default)
_STRIDED.handler = None
_STRIDED.call = _strided.compute


def _copy_into(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    return _copy_(aten.copy_.default, (dst, src), {})


def _storage_device() -> torch.device:
    """Where device tensors keep their values: the CPU, or nowhere (meta) in a dry run."""
    return dry_run.META if _runtime.current().dry_run else _CPU


def _count_factory(strided: bool) -> None:
    _runtime.current().metrics.inc(EMPTY_STRIDED if strided else EMPTY)


FACTORY_KERNELS = FactoryKernels(
    wrap_factory, _copy_into, reserve_factory, _storage_device, _count_factory
)
