"""Simulated ``xla`` device tensors: a wrapper subclass around a CPU tensor.

Ops compute eagerly on the wrapped CPU tensor, so results equal eager CPU torch bit for bit,
while each op also records a lazy-IR node (see ``_graph``) so compile accounting follows what
real torch_xla would do with the same program.
"""

from __future__ import annotations

import itertools
import time
import weakref
from typing import Any

import torch

from xlasim.runtime import errors as _errors
from xlasim.runtime import graph as _graph
from xlasim.runtime import state as _runtime
from xlasim.runtime.device import FactoryKernels, set_wrapper_meta
from xlasim.runtime.graph import InputRef, Node, RecordedCall, stable_id

aten = torch.ops.aten

_CPU = torch.device("cpu")
_creation_order = itertools.count()

# Ops whose result carries the very IR value of their input in torch_xla (no new node).
_IDENTITY_OPS = frozenset({aten.detach.default, aten.alias.default, aten.lift_fresh.default})
_devices: dict[int, torch.device] = {}


def xla_device(index: int | None) -> torch.device:
    index = index or 0
    dev = _devices.get(index)
    if dev is None:
        dev = _devices[index] = torch.device("xla", index)
    return dev


class XlaSimTensor(torch.Tensor):
    _elem: torch.Tensor
    _node: Node | None
    _sharding: Any

    _seq: int
    _leaf: Any
    _aliased: bool

    __slots__ = ("_elem", "_node", "_sharding", "_seq", "_leaf", "_aliased")

    @staticmethod
    def __new__(cls, elem: torch.Tensor, device: torch.device, node: Node | None = None):
        r = torch.Tensor._make_wrapper_subclass(
            cls,
            elem.size(),
            strides=elem.stride(),
            storage_offset=elem.storage_offset(),
            dtype=elem.dtype,
            layout=elem.layout,
            device=device,
            requires_grad=False,
        )
        r._elem = elem
        r._node = node
        r._sharding = None
        r._leaf = None
        # True while pending IR updates device data in place (XLA aliases that buffer).
        r._aliased = False
        # torch_xla orders a graph's outputs by tensor creation; so do we.
        r._seq = next(_creation_order)
        return r

    def __repr__(self, *, tensor_contents: Any = None) -> Any:  # type: ignore[override]
        materialize([self])
        text = torch._tensor_str._str(self._elem.detach())
        suffix = f"device='{self.device}'"
        grad = self.grad_fn
        extra = (
            f", grad_fn=<{type(grad).__name__}>"
            if grad is not None
            else (", requires_grad=True" if self.requires_grad else "")
        )
        # CPU formatting ends with ")"; torch puts the device first among the suffixes.
        body = text[:-1]
        if ", dtype=" in body and not body.endswith("]"):
            head, _, dtype = body.rpartition(", dtype=")
            return f"{head}, {suffix}, dtype={dtype}{extra})"
        return f"{body}, {suffix}{extra})"

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
        return self._reduce_ex_internal(proto)

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[override]
        handler = _SPECIAL.get(func)
        if handler is not None:
            return handler(func, args, kwargs or {})
        if func in _IDENTITY_OPS:
            src = args[0]
            out = XlaSimTensor(func(src._elem), src.device, src._node)
            out._sharding = src._sharding
            if src._node is not None:
                _runtime.current().graphs.pending.append(weakref.ref(out))
            return out
        return _run(func, args, kwargs or {})


def _leaf_key(t: XlaSimTensor) -> tuple[Any, ...]:
    """A device-data input as the graph hash sees it (made an ``InputInfo`` only on demand)."""
    sharding = t._sharding
    return (tuple(t.shape), t.dtype, sharding.op.to_string() if sharding else "")


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
    return entry


class _Call:
    """Unwraps one op's arguments, remembering its xla inputs for the IR node."""

    __slots__ = ("device", "inputs", "hashes", "elems", "keys", "refs")

    def __init__(self) -> None:
        self.device: torch.device | None = None
        self.inputs: list[Any] = []
        self.hashes: list[int] = []
        self.elems: dict[int, XlaSimTensor] = {}
        self.keys: list[Any] = []
        # id(xla tensor) -> its InputRef, kept only while calls are recorded for a compiler.
        self.refs: dict[int, InputRef] | None = {} if _graph.RECORD_CALLS else None

    def unwrap(self, a: Any) -> Any:
        if type(a) is XlaSimTensor:
            if self.device is None:
                self.device = a.device
            elem = a._elem
            self.elems[id(elem)] = a
            node = a._node
            if node is None:
                _, key, leaf_hash = _leaf_entry(a)
                self.inputs.append(key)
                self.hashes.append(leaf_hash)
            else:
                self.inputs.append(node)
                self.hashes.append(node.hash)
            if self.refs is not None:
                leaf = weakref.ref(a) if node is None else None
                self.refs[id(a)] = InputRef(len(self.inputs) - 1, leaf, a._sharding)
            return elem
        if type(a) is list or type(a) is tuple:
            if a and isinstance(a[0], torch.Tensor):
                return type(a)(self.unwrap(x) for x in a)
            self.keys.append(_arg_key(a))
            return a
        if isinstance(a, torch.device) and a.type == "xla":
            return _CPU
        if a is not None:
            self.keys.append(_arg_key(a))
        return a


def _run(func, args, kwargs):
    runtime = _runtime.current()
    call = _Call()
    unwrap = call.unwrap
    cargs = [unwrap(a) for a in args]
    user_kwargs = kwargs
    takes_generator = _RANDOM_OPS.get(func)
    if takes_generator is None:
        takes_generator = _RANDOM_OPS[func] = _has_generator_arg(func)
    if kwargs:
        kwargs = {k: unwrap(v) for k, v in kwargs.items()}
        if takes_generator and kwargs.get("generator") is None:
            kwargs["generator"] = runtime.generator
    elif takes_generator:
        kwargs = {"generator": runtime.generator}
    try:
        out = func(*cargs, **kwargs)
    except RuntimeError as exc:
        message = _errors.translate(func, tuple(cargs), exc)
        if message is None:
            raise
        raise RuntimeError(message) from None
    base = hash((stable_id(func), tuple(call.hashes), tuple(call.keys)))
    inputs = tuple(call.inputs)
    device = call.device or xla_device(runtime.default_device_index)
    pending = runtime.graphs.pending
    record = None if call.refs is None else _recorded_args(call.refs, args, user_kwargs)
    if type(out) is torch.Tensor:
        return _wrap_output(out, 0, func, base, inputs, device, call.elems, pending, record)
    if isinstance(out, (tuple, list)):
        return type(out)(
            _wrap_output(o, i, func, base, inputs, device, call.elems, pending, record)
            if isinstance(o, torch.Tensor)
            else o
            for i, o in enumerate(out)
        )
    return out


def _recorded_args(refs: dict[int, InputRef], args: Any, kwargs: dict[str, Any]) -> Any:
    """The op's arguments with its xla tensors replaced by their InputRefs (the user's
    kwargs, before the simulator adds its generator)."""

    def swap(a: Any) -> Any:
        if type(a) is XlaSimTensor:
            return refs[id(a)]
        if type(a) is list or type(a) is tuple:
            return type(a)(swap(x) for x in a)
        return a

    return tuple(swap(a) for a in args), {k: swap(v) for k, v in kwargs.items()}


def _wrap_output(o, index, func, base, inputs, device, elems, pending, record=None):
    call = None if record is None else RecordedCall(record[0], record[1], index)
    node = Node(hash((base, index, tuple(o.shape), stable_id(o.dtype))), func, inputs, call)
    existing = elems.get(id(o))
    if existing is not None:  # in-place / out= ops hand back their input
        if existing.shape != o.shape or existing.stride() != o.stride():
            set_wrapper_meta(existing, o)
            existing._leaf = None
        if existing._node is None:
            existing._aliased = True
        existing._node = node
        pending.append(weakref.ref(existing))
        return existing
    t = XlaSimTensor(o, device, node)
    pending.append(weakref.ref(t))
    return t


def _has_generator_arg(op: Any) -> bool:
    return any(a.name == "generator" for a in op._schema.arguments)


# op -> whether it takes a generator: simulated devices draw from the runtime's own generator,
# as torch_xla's device RNG is separate from the CPU one (seeded by torch_xla.manual_seed).
_RANDOM_OPS: dict[Any, bool] = {}


def wrap_data(elem: torch.Tensor, device: torch.device | None) -> XlaSimTensor:
    """A device-data tensor (no pending IR), as a host-to-device transfer produces."""
    runtime = _runtime.current()
    index = (
        device.index
        if device is not None and device.index is not None
        else (runtime.default_device_index)
    )
    runtime.devices_used = True
    return XlaSimTensor(elem, xla_device(index))


def wrap_factory(elem: torch.Tensor, device: torch.device | None) -> XlaSimTensor:
    """A tensor made on the device by a factory op: pending IR, like torch_xla's constants."""
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
    )
    runtime.graphs.pending.append(weakref.ref(t))
    return t


def materialize(tensors: list[XlaSimTensor]) -> None:
    """Runs the graph needed for ``tensors`` only (what ``_to_cpu`` does in torch_xla)."""
    if any(t._node is not None for t in tensors):
        _runtime.current().graphs.execute(tensors, sync_all=False)


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
        start = time.perf_counter_ns()
        out = aten._to_copy.default(src._elem, **cpu_kwargs)
        if target.type != "cpu":
            out = out.to(target)
        runtime.metrics.add_sample("TransferFromDeviceTime", time.perf_counter_ns() - start)
        return out
    if target is not None and target.index is not None and target.index != src.device.index:
        # Device to device copy: a new device-data tensor on the other device.
        materialize([src])
        return wrap_data(aten._to_copy.default(src._elem, **cpu_kwargs), target)
    return _run(func, args, kwargs)


def _copy_(func, args, kwargs):
    dst, src = args[0], args[1]
    if isinstance(dst, XlaSimTensor) and not isinstance(src, XlaSimTensor):
        # Host to device transfer into an existing device tensor: it becomes device data.
        runtime = _runtime.current()
        start = time.perf_counter_ns()
        dst._elem.copy_(src, **kwargs)
        dst._node = None
        runtime.metrics.add_sample("TransferToDeviceTime", time.perf_counter_ns() - start)
        from xlasim.runtime import memory

        memory.check_fits(runtime, dst, None)
        return dst
    if not isinstance(dst, XlaSimTensor):
        materialize([src])
        dst.copy_(src._elem, **kwargs)
        return dst
    return _run(func, args, kwargs)


def _local_scalar_dense(func, args, kwargs):
    src = args[0]
    runtime = _runtime.current()
    materialize([src])
    # torch_xla has no lowering for it: it is a CPU fallback, counted as such.
    runtime.metrics.inc("aten::_local_scalar_dense")
    start = time.perf_counter_ns()
    value = func(src._elem)
    runtime.metrics.add_sample("TransferFromDeviceTime", time.perf_counter_ns() - start)
    return value


_SPECIAL = {
    aten._to_copy.default: _to_copy,
    aten.copy_.default: _copy_,
    aten._local_scalar_dense.default: _local_scalar_dense,
}


def _copy_into(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    return _copy_(aten.copy_.default, (dst, src), {})


FACTORY_KERNELS = FactoryKernels(wrap_factory, _copy_into)
