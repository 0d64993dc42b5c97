"""The device data a pending graph reads, and ids for tensor values: what torch_xla's
``_get_tensors_xla_device_data_node`` and ``_xla_get_tensor_id`` answer from its IR.

torch_xla 2.9 (measured on CPU): a graph's device-data inputs are listed once each, operands
first (``t1 * t2 + t1`` gives t1, t2); a device-data tensor is its own only input. A tensor
keeps its id through a sync, and an op writing into it gives it a new one (functionalization
makes a new XLA tensor for the new value). Python scalars other than 0 and +-1 and the RNG
seed are device data there too; the simulator's graphs do not record them as inputs, so a
graph using them raises NotImplementedError. As torch_xla's IR holds the data itself, a graph
lists data whose tensor is gone or was written over since (with the id it had), once the
process has asked about graph inputs (:mod:`xlasim.runtime.data_keys`).

``_run_cached_graph`` runs a graph ``_xla_warm_up_cache`` compiled on new data: the simulator
keeps the graph's ops (as :mod:`xlasim.runtime.pending_fx` rebuilds them) and computes them
again on the given values.
"""

from __future__ import annotations

import itertools
import time
import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from xlasim.runtime import data_keys, pending_fx
from xlasim.runtime.graph import Node
from xlasim.runtime.state import SimRuntime
from xlasim.runtime.tensor import (
    XlaSimTensor,
    compute,
    data_holder,
    device_data_key,
    leaf_input,
    wrap_data,
)

aten = torch.ops.aten

_value_ids = itertools.count(1)
# id(tensor) -> (the tensor, weakly; the IR value its id was given for: pending node or
# device-data key; the id). Keyed by identity: a tensor's == compares values.
_IDS: dict[int, tuple[weakref.ref[XlaSimTensor], Any, int]] = {}


def _current_value(t: XlaSimTensor) -> Any:
    return t._node if t._node is not None else device_data_key(t)


def tensor_id(t: XlaSimTensor) -> int:
    """``t``'s id: kept while ``t`` holds the same value (a sync only materializes it), a new
    one once an op has written a new value into it."""
    data_keys.keep_data()
    value = _current_value(t)
    known = _IDS.get(id(t))
    if known is not None and known[0]() is t and (known[1] is value or t._node is None):
        number = known[2]
    else:
        number = next(_value_ids)
    _remember(t, value, number)
    if t._node is None:
        value.number = number  # the id the data keeps once its tensor moved on
    return number


def _remember(t: XlaSimTensor, value: Any, number: int) -> None:
    key = id(t)
    _IDS[key] = (weakref.ref(t, lambda _: _IDS.pop(key, None)), value, number)


def _is_random(op: Any) -> bool:
    name = str(op)
    return any(word in name for word in ("uniform", "normal", "bernoulli", "random", "rand"))


def _scalar_data(node: Node) -> list[Any]:
    """The Python numbers ``node``'s op takes as operands, which torch_xla makes device data
    (all but 0 and +-1): any float, and an int where the schema takes a Scalar or a Tensor
    (not an int, a dim or a size)."""
    if not isinstance(node.args, tuple) or len(node.args) != 2:
        return []
    args, kwargs = node.args
    schema = getattr(node.op, "_schema", None)
    takes_numbers = schema is not None and any(
        str(a.type).startswith(("Scalar", "Tensor")) for a in schema.arguments[1:]
    )
    values = [*args, *(kwargs or {}).values()]
    return [
        v
        for v in values
        if isinstance(v, (int, float))
        and not isinstance(v, bool)
        and v not in (0, 1, -1)
        and (isinstance(v, float) or takes_numbers)
    ]


def _check_recorded_inputs(node: Node) -> None:
    if _is_random(node.op):
        raise NotImplementedError(
            f"xlasim does not simulate the RNG seed as a graph's device data ({node.op} draws "
            "random numbers)"
        )
    scalars = _scalar_data(node)
    if scalars:
        raise NotImplementedError(
            f"xlasim does not simulate Python scalars as a graph's device data ({node.op} "
            f"with {scalars})"
        )


def donated_positions(tensors: list[XlaSimTensor]) -> tuple[int, ...]:
    """The parameter positions of the graph's inputs whose buffers are marked for donation
    (device data the simulator does not list, such as scalars, is never marked)."""
    held = device_data_inputs(tensors, strict=False)
    donors = held[0]._rt.graphs.donors if held else None
    return tuple(
        i
        for i, t in enumerate(held)
        if donors is not None and t._node is None and donors.is_marked(leaf_input(t))
    )


# Ops that overwrite their tensor operand whole: torch_xla lowers them to a constant, so the
# operand's data is no input of the graph (measured on CPU: ``b.zero_()`` lists nothing).
_OPERAND_UNREAD = frozenset(
    {aten.zero_.default, aten.zero.default, aten.fill_.Scalar, aten.fill.Scalar}
)


def input_keys(tensors: list[XlaSimTensor], strict: bool = True) -> list[Any]:
    """The keys of the device data the graph computing ``tensors`` reads, each once, in the
    order torch_xla numbers them (``strict``: refusing inputs the simulator does not list)."""
    found: list[Any] = []
    seen: set[int] = set()

    def add_data(key: Any) -> None:
        if id(key) not in seen:
            seen.add(id(key))
            found.append(key)

    for t in tensors:
        if t._node is None:
            add_data(device_data_key(t))
            continue
        if id(t._node) in seen:
            continue
        # Depth first from each tensor's value, an op's operands last to first (the order
        # torch_xla lowers them in, which numbers the program's parameters).
        seen.add(id(t._node))
        stack: list[Any] = [t._node]
        while stack:
            item = stack.pop()
            if not isinstance(item, Node):
                add_data(item)
                continue
            if strict:
                _check_recorded_inputs(item)
            if item.op in _OPERAND_UNREAD:
                continue
            for operand in item.inputs:
                if isinstance(operand, Node):
                    if id(operand) not in seen:
                        seen.add(id(operand))
                        stack.append(operand)
                elif isinstance(operand, tuple):  # a device-data key
                    stack.append(operand)
    return found


def device_data_inputs(tensors: list[XlaSimTensor], strict: bool = True) -> list[XlaSimTensor]:
    """The data tensors the graph computing ``tensors`` reads, each once, in the order
    torch_xla numbers them: the tensor holding each, or (``strict``) a new tensor on the data
    its key kept once that tensor is gone or holds other data."""
    found: list[XlaSimTensor] = []
    for key in input_keys(tensors, strict):
        holder = data_holder(key)
        if holder is None and strict:
            holder = _kept_tensor(key)
        if holder is not None:
            found.append(holder)
    return found


def _kept_tensor(key: Any) -> XlaSimTensor:
    """A new device tensor on the data ``key`` kept, with the id that data had."""
    if getattr(key, "data", None) is None:
        raise NotImplementedError(
            "xlasim does not simulate listing device data whose tensor is gone or holds "
            "other data now, when it went before the process asked about a graph's device "
            "data (torch_xla's IR keeps the data itself; the simulator keeps it from the "
            "first _xla_get_tensor_id, _get_tensors_xla_device_data_node or "
            "_xla_warm_up_cache on)"
        )
    t = wrap_data(key.data.clone(), key.device)
    if key.number is None:
        key.number = next(_value_ids)
    _remember(t, device_data_key(t), key.number)
    return t


def listed_inputs(tensors: list[XlaSimTensor]) -> tuple[list[int], list[torch.Tensor]]:
    """(ids, tensors) of the device data the tensors' graph reads, as
    ``_get_tensors_xla_device_data_node`` answers: each tensor a new one on that data."""
    data_keys.keep_data()
    held = device_data_inputs(tensors)
    with torch.no_grad():
        return [tensor_id(t) for t in held], [t.detach() for t in held]


@dataclass
class TracedRun:
    """A compiled graph as ``_run_cached_graph`` runs it: its ops over its device data
    (``program``, placeholders standing for ``placeholders`` in order), and the data it takes
    as parameters (``inputs``, in parameter order: a placeholder not among them is data the
    graph does not read, such as what ``zero_`` overwrote). ``refused``: why the simulator
    cannot run the graph again, raised when it is asked to."""

    program: torch.fx.GraphModule | None
    placeholders: list[Any]
    inputs: list[Any]
    device: torch.device
    refused: str | None = None


def warm_up(rt: SimRuntime, tensors: list[XlaSimTensor], graph_hash: bytes) -> None:
    """Compiles the graph of the pending ``tensors`` (without running it) and keeps it for
    ``run_traced``; each pending tensor is one output, however often it is given."""
    data_keys.keep_data()
    pending: list[XlaSimTensor] = []
    for t in tensors:
        if t._node is not None and all(t._node is not p._node for p in pending):
            pending.append(t)
    inputs = input_keys(tensors)
    rt.graphs.warm_up(pending)
    if not pending:
        return
    try:
        program, placeholders = pending_fx.graph_over(pending, device_data_key)
        refused = None
    except NotImplementedError as exc:
        program, placeholders, refused = None, [], str(exc)
    rt.traced_runs[graph_hash] = TracedRun(
        program, placeholders, inputs, pending[0].device, refused
    )


def _value(t: Any) -> torch.Tensor:
    if isinstance(t, XlaSimTensor):
        if t._node is not None:
            raise NotImplementedError(
                "xlasim does not simulate running a cached graph on pending IR inputs"
            )
        return t._elem
    return t


class _Replay(torch.fx.Interpreter):
    """Runs a traced graph's ops on CPU values as the simulated device computes them."""

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        if isinstance(target, torch._ops.OpOverload):
            return compute(target)(*args, **kwargs)
        return super().call_function(target, args, kwargs)


def run_traced(rt: SimRuntime, graph_hash: bytes, inputs: list[Any]) -> list[XlaSimTensor]:
    """The outputs of compiled graph ``graph_hash`` on ``inputs`` (device or CPU tensors in
    parameter order), as fresh device data."""
    run = rt.traced_runs.get(graph_hash)
    if run is None:
        raise RuntimeError(
            "Check failed: cachedComputation: Failed to get computation by hash "
            f"{graph_hash[::-1].hex()}. Maybe the entry get kicked out of the LRU cache"
        )
    if run.refused is not None or run.program is None:
        raise NotImplementedError(f"xlasim cannot run this cached graph again: {run.refused}")
    start = time.perf_counter_ns()
    values = [_value(t) for t in inputs]
    if len(values) != len(run.inputs):
        raise RuntimeError(
            f"the cached graph takes {len(run.inputs)} device data inputs, {len(values)} given"
        )
    for i, (v, key) in enumerate(zip(values, run.inputs, strict=True)):
        if tuple(v.shape) != tuple(key[0]) or v.dtype != key[1]:
            raise RuntimeError(
                f"input {i} of the cached graph is {v.dtype} {list(v.shape)}, the graph was "
                f"compiled for {key[1]} {list(key[0])}"
            )
    given = {id(key): v for key, v in zip(run.inputs, values, strict=True)}
    args = [
        given[id(key)] if id(key) in given else torch.empty(tuple(key[0]), dtype=key[1])
        for key in run.placeholders
    ]
    rt.metrics.add_sample("RunCachedGraphInputData", time.perf_counter_ns() - start)
    with torch.no_grad():
        results = _Replay(run.program).run(*args)
    # A program's outputs are buffers of their own, never views of its inputs' data.
    input_storages = {a.untyped_storage().data_ptr() for a in args}
    outputs = [
        wrap_data(r.clone() if r.untyped_storage().data_ptr() in input_storages else r, run.device)
        for r in results
    ]
    rt.metrics.add_sample("ExecuteTime", time.perf_counter_ns() - start)
    rt.metrics.add_sample("RunCachedGraphOutputData", time.perf_counter_ns() - start)
    return outputs
