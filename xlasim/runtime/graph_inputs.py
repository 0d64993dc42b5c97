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
import weakref
from typing import Any

from xlasim.runtime.graph import Node
from xlasim.runtime.tensor import XlaSimTensor, data_holder, device_data_key

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


def device_data_inputs(tensors: list[XlaSimTensor]) -> list[XlaSimTensor]:
    """The data tensors the graph computing ``tensors`` reads, each once, operands first."""
    found: list[XlaSimTensor] = []
    seen: set[int] = set()

    def add_data(key: Any) -> None:
        if id(key) in seen:
            return
        seen.add(id(key))
        holder = data_holder(key)
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
        stack: list[tuple[Node, int]] = [(t._node, 0)]
        seen.add(id(t._node))
        while stack:
            node, k = stack.pop()
            if k == 0:
                if _is_random(node.op):
                    raise NotImplementedError(
                        f"xlasim does not simulate the RNG seed as a graph's device data "
                        f"({node.op} draws random numbers)"
                    )
                if _scalar_data(node):
                    raise NotImplementedError(
                        f"xlasim does not simulate Python scalars as a graph's device data "
                        f"({node.op} with {_scalar_data(node)})"
                    )
            if k < len(node.inputs):
                stack.append((node, k + 1))
                item = node.inputs[k]
                if isinstance(item, Node):
                    if id(item) not in seen:
                        seen.add(id(item))
                        stack.append((item, 0))
                elif isinstance(item, tuple):  # a device-data key
                    add_data(item)
    return found
