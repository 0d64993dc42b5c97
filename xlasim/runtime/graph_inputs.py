"""The device data a pending graph reads, and ids for tensor values: what torch_xla's
``_get_tensors_xla_device_data_node`` and ``_xla_get_tensor_id`` answer from its IR.

torch_xla 2.9 (measured on CPU): a graph's device-data inputs are listed once each, operands
first (``t1 * t2 + t1`` gives t1, t2); a device-data tensor is its own only input. A tensor
keeps its id through a sync, and an op writing into it gives it a new one (functionalization
makes a new XLA tensor for the new value). Python scalars other than 0 and +-1 and the RNG
seed are device data there too; the simulator's graphs do not record them as inputs, so a
graph using them raises NotImplementedError.
"""

from __future__ import annotations

import itertools
import time
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from xlasim.runtime.graph import Node
from xlasim.runtime.state import SimRuntime
from xlasim.runtime.tensor import (
    XlaSimTensor,
    data_holder,
    device_data_key,
    leaf_input,
    wrap_data,
)

_value_ids = itertools.count(1)
# id(tensor) -> (the tensor, weakly; the IR value its id was given for: pending node or
# device-data key; the id). Keyed by identity: a tensor's == compares values.
_IDS: dict[int, tuple[weakref.ref[XlaSimTensor], Any, int]] = {}


def _current_value(t: XlaSimTensor) -> Any:
    return t._node if t._node is not None else device_data_key(t)


def tensor_id(t: XlaSimTensor) -> int:
    """``t``'s id: kept while ``t`` holds the same value (a sync only materializes it), a new
    one once an op has written a new value into it."""
    value = _current_value(t)
    known = _IDS.get(id(t))
    if known is not None and known[0]() is t and (known[1] is value or t._node is None):
        number = known[2]
    else:
        number = next(_value_ids)
    key = id(t)
    _IDS[key] = (weakref.ref(t, lambda _: _IDS.pop(key, None)), value, number)
    return number


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


def device_data_inputs(tensors: list[XlaSimTensor], strict: bool = True) -> list[XlaSimTensor]:
    """The data tensors the graph computing ``tensors`` reads, each once, in the order
    torch_xla numbers them."""
    found: list[XlaSimTensor] = []
    seen: set[int] = set()

    def add_data(key: Any) -> None:
        if id(key) in seen:
            return
        seen.add(id(key))
        holder = data_holder(key)
        if holder is None and not strict:
            return
        if holder is None:
            raise NotImplementedError(
                "xlasim does not simulate listing device data whose tensor is gone or holds "
                "other data now (torch_xla's IR keeps the data itself)"
            )
        found.append(holder)

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
            for operand in item.inputs:
                if isinstance(operand, Node):
                    if id(operand) not in seen:
                        seen.add(id(operand))
                        stack.append(operand)
                elif isinstance(operand, tuple):  # a device-data key
                    stack.append(operand)
    return found


@dataclass
class TracedRun:
    """A compiled graph as ``_run_cached_graph`` can run it: the values of the device data it
    was traced on (in parameter order) and of its outputs then.

    The simulator computes values as ops run and keeps no program to run on other data, so
    a graph runs again only on inputs equal to the traced ones (its ops are deterministic:
    random ones are refused when its inputs are listed), giving the traced outputs."""

    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]
    device: torch.device


def warm_up(rt: SimRuntime, tensors: list[XlaSimTensor], graph_hash: bytes) -> None:
    """Compiles the graph of the pending ``tensors`` (without running it) and keeps it for
    ``run_traced``; each pending tensor is one output, however often it is given."""
    pending: list[XlaSimTensor] = []
    for t in tensors:
        if t._node is not None and all(t._node is not p._node for p in pending):
            pending.append(t)
    inputs = [t._elem.detach().clone() for t in device_data_inputs(tensors)]
    rt.graphs.warm_up(pending)
    if pending:
        outputs = [t._elem.detach().clone() for t in pending]
        rt.traced_runs[graph_hash] = TracedRun(inputs, outputs, pending[0].device)


def _value(t: Any) -> torch.Tensor:
    if isinstance(t, XlaSimTensor):
        if t._node is not None:
            raise NotImplementedError(
                "xlasim does not simulate running a cached graph on pending IR inputs"
            )
        return t._elem
    return t


def run_traced(rt: SimRuntime, graph_hash: bytes, inputs: list[Any]) -> list[XlaSimTensor]:
    """The outputs of compiled graph ``graph_hash`` on ``inputs`` (device or CPU tensors in
    parameter order), as fresh device data."""
    run = rt.traced_runs.get(graph_hash)
    if run is None:
        raise RuntimeError(
            "Check failed: cachedComputation: Failed to get computation by hash "
            f"{graph_hash[::-1].hex()}. Maybe the entry get kicked out of the LRU cache"
        )
    start = time.perf_counter_ns()
    values = [_value(t) for t in inputs]
    same = len(values) == len(run.inputs) and all(
        v.shape == r.shape and v.dtype == r.dtype and torch.equal(v.cpu(), r)
        for v, r in zip(values, run.inputs, strict=False)
    )
    if not same:
        raise NotImplementedError(
            "xlasim does not simulate running a cached graph (_run_cached_graph) on data other "
            "than it was traced on: the simulator keeps the traced values, not a program"
        )
    rt.metrics.add_sample("RunCachedGraphInputData", time.perf_counter_ns() - start)
    outputs = [wrap_data(v.clone(), run.device) for v in run.outputs]
    rt.metrics.add_sample("ExecuteTime", time.perf_counter_ns() - start)
    rt.metrics.add_sample("RunCachedGraphOutputData", time.perf_counter_ns() - start)
    return outputs
