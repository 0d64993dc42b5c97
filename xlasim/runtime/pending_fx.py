"""The pending graph of some device tensors as an FX graph of ATen ops over their device data:
what ``xm.get_stablehlo`` lowers.

The graph keeps, for each pending op, the op, its tensor operands (pending values or device
data) and its other arguments; the op's call is rebuilt from its schema (tensor parameters
take the tensor operands first, then the recorded constants; a tensor-list parameter takes the
operands no later tensor parameter needs).  Device data becomes one placeholder per buffer, in
torch_xla's order (a walk from each tensor in turn, depth first, an op's operands last to
first).  An op whose call cannot be rebuilt so raises ``NotImplementedError`` naming it.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch

from xlasim.runtime.graph import CustomCall, Node

_MISSING = object()


def _is_tensor_type(t: Any) -> bool:
    if isinstance(t, torch.OptionalType):
        t = t.getElementType()
    return isinstance(t, torch.TensorType)


def _is_tensor_list(t: Any) -> bool:
    if isinstance(t, torch.OptionalType):
        t = t.getElementType()
    return isinstance(t, torch.ListType) and _is_tensor_type(t.getElementType())


def _unsupported(op: Any, why: str) -> NotImplementedError:
    return NotImplementedError(
        f"xlasim: the StableHLO of pending tensors made by {op} is not simulated ({why}) "
        "(xm.get_stablehlo)"
    )


def _constant(op: Any, value: Any) -> Any:
    """A recorded non-device argument as the graph takes it: a wrapped Python number (a 0-d
    CPU tensor) as the number."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 0 or value.device.type != "cpu":
            raise _unsupported(op, "a host tensor argument")
        return value.item()
    return value


def _functional(op: Any) -> Any:
    schema = op._schema
    if not schema.is_mutable:
        return op
    name = schema.name.split("::", 1)[1]
    packet = getattr(torch.ops.aten, name.removesuffix("_"), None)
    overload = getattr(packet, op._overloadname, None) if packet is not None else None
    if overload is None or not name.endswith("_"):
        raise _unsupported(op, "an in-place op with no functional form")
    return overload


def _call(node: Node, operands: list[Any]) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    op = node.op
    if isinstance(node.args, CustomCall):
        raise _unsupported(op, "a custom call")
    if not isinstance(op, torch._ops.OpOverload) or not isinstance(node.args, tuple):
        raise _unsupported(op, "its arguments were not recorded")
    consts = list(node.args[0])
    kwargs = dict(node.args[1] or {})
    # Tensors given as keyword arguments come last among the operands.
    tensor_kwargs = [k for k, v in kwargs.items() if isinstance(v, torch.Tensor) and _is_xla(v)]
    positional_tensors = operands[: len(operands) - len(tensor_kwargs)]
    for key, value in zip(tensor_kwargs, operands[len(positional_tensors) :], strict=True):
        kwargs[key] = value
    params = [p for p in op._schema.arguments if not p.kwarg_only]
    tensors = iter(positional_tensors)
    remaining = len(positional_tensors)
    args: list[Any] = []
    for i, param in enumerate(params):
        if remaining == 0 and not consts:
            break
        if _is_tensor_list(param.type) and consts and consts[0] is None:
            later = sum(1 for p in params[i + 1 :] if _is_tensor_type(p.type))
            count = remaining - later
            args.append([next(tensors) for _ in range(count)])
            remaining -= count
            consts.pop(0)
        elif _is_tensor_type(param.type) and remaining:
            args.append(next(tensors))
            remaining -= 1
        elif consts:
            args.append(_constant(op, consts.pop(0)))
        else:
            raise _unsupported(op, "its operands do not fit its schema")
    if remaining or consts:
        raise _unsupported(op, "its operands do not fit its schema")
    kwargs = {k: _constant(op, v) for k, v in kwargs.items() if k != "generator"}
    return _functional(op), tuple(args), kwargs


def _is_xla(t: torch.Tensor) -> bool:
    return t.device.type == "xla"


def _walk(roots: Sequence[Any]) -> list[Any]:
    """Post-order of the pending graph from each root in turn, an op's operands last first."""
    order: list[Any] = []
    seen: set[int] = set()
    for root in roots:
        stack: list[tuple[Any, bool]] = [(root, False)]
        while stack:
            item, done = stack.pop()
            if done:
                order.append(item)
                continue
            if id(item) in seen:
                continue
            seen.add(id(item))
            stack.append((item, True))
            if isinstance(item, Node):
                stack.extend((operand, False) for operand in item.inputs)
    return order


def pending_graph(
    tensors: Sequence[Any], leaf_of: Any
) -> tuple[torch.fx.GraphModule, list[tuple[tuple[int, ...], torch.dtype]]]:
    """The graph computing ``tensors`` (simulated device tensors; ``leaf_of(t)`` is the device
    data a tensor without a pending op reads) and its inputs' shapes and dtypes, in order."""
    module, leaves = graph_over(tensors, leaf_of)
    return module, [(tuple(leaf[0]), leaf[1]) for leaf in leaves]


def graph_over(
    tensors: Sequence[Any], leaf_of: Any
) -> tuple[torch.fx.GraphModule, list[tuple[Any, ...]]]:
    """``pending_graph``, with the device-data keys its placeholders stand for, in order."""
    roots = [t._node if t._node is not None else leaf_of(t) for t in tensors]
    order = _walk(roots)
    graph = torch.fx.Graph()
    values: dict[int, Any] = {}
    inputs: list[tuple[Any, ...]] = []
    for item in order:
        if not isinstance(item, Node):
            values[id(item)] = graph.placeholder(f"p{len(inputs)}")
            inputs.append(item)
    calls: dict[int, Any] = {}  # id(recorded constants) -> the one call of a multi-output op
    for item in order:
        if not isinstance(item, Node):
            continue
        operands = [values[id(o)] for o in item.inputs]
        index = item.args[2] if isinstance(item.args, tuple) and len(item.args) > 2 else None
        key = id(item.args[0]) if index is not None else id(item)
        call = calls.get(key)
        if call is None:
            target, args, kwargs = _call(item, operands)
            call = calls[key] = graph.call_function(target, args, kwargs)
        values[id(item)] = (
            call if index is None else graph.call_function(operator.getitem, (call, index))
        )
    graph.output([values[id(r)] for r in roots])
    return torch.fx.GraphModule(torch.nn.Module(), graph), inputs
