"""Pattern instances marked with ``xla::mark_tensor`` as ``stablehlo.composite`` ops: what
torch_xla's StableHLO export makes of them (learned from torch_xla 2.9's text: one composite
per instance, named for the pattern, its attributes as ``composite_attributes`` (a Python
float as ``f32``), its body a private function ``@<name>.impl``, then ``.impl_0``, ... for
further instances).

jax's ``lax.composite`` writes the op; its body function is named for the pattern, which
``torch_xla_names`` renames to torch_xla's.  Part of the optional TPU-compiler layer.
"""

from __future__ import annotations

import copy
import operator
import re
from dataclasses import dataclass, field
from typing import Any

# First, as in ``stablehlo``: jax must be imported inside libtpu's load environment.
from xlasim.runtime.compiler import libtpu

# isort: split
import numpy as np
import torch
from jax import lax


def _is_mark(node: torch.fx.Node) -> bool:
    target = node.target
    return (
        node.op == "call_function"
        and isinstance(target, torch._ops.OpOverload)
        and target.namespace == "xla"
        and target._opname == "mark_tensor"
    )


@dataclass
class _Instance:
    name: str
    inputs: dict[int, torch.fx.Node] = field(default_factory=dict)
    outputs: dict[int, torch.fx.Node] = field(default_factory=dict)
    attr: dict[str, Any] = field(default_factory=dict)


def _instances(graph: torch.fx.Graph) -> list[_Instance]:
    found: dict[str, _Instance] = {}
    for node in graph.nodes:
        if not _is_mark(node):
            continue
        args = list(node.args) + [None] * (6 - len(node.args))
        _, name, pos, ident, is_input, attr = args
        attr = node.kwargs.get("attr", attr)
        instance = found.setdefault(ident, _Instance(name))
        (instance.inputs if is_input else instance.outputs)[pos] = node
        if attr is not None:
            instance.attr = dict(attr)
    return [i for i in found.values() if i.outputs]


def _attribute(value: Any) -> Any:
    # torch_xla writes a float attribute as f32 (jax would write a Python float as f64), and a
    # list as a dense tensor.
    if isinstance(value, float):
        return np.float32(value)
    if isinstance(value, (list, tuple)):
        # A list as a dense 1-D tensor attribute, f32 for floats.
        kinds = {type(v) for v in value}
        dtype = np.float32 if float in kinds else np.bool_ if kinds == {bool} else np.int64
        return np.array(value, dtype=dtype)
    return value


def _body(instance: _Instance, module: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """The instance's ops as a graph of its marked inputs (in position order)."""
    inputs = [instance.inputs[p] for p in sorted(instance.inputs)]
    outputs = [instance.outputs[p] for p in sorted(instance.outputs)]
    inside: set[torch.fx.Node] = set()
    stack: list[Any] = [_marked(o) for o in outputs]
    while stack:
        node = stack.pop()
        if not isinstance(node, torch.fx.Node) or node in inside or node in inputs:
            continue
        if node.op in ("placeholder", "get_attr") or _is_mark(node):
            raise NotImplementedError(
                f"xlasim: a composite ({instance.name}) that reads a value other than its "
                f"marked inputs ({node.name}) is not simulated"
            )
        inside.add(node)
        stack.extend(node.all_input_nodes)
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for i, mark in enumerate(inputs):
        env[mark] = graph.placeholder(f"input_{i}")
        env[mark].meta = copy.copy(mark.meta)
    for node in module.graph.nodes:  # graph order is an order of dependencies
        if node in inside:
            env[node] = graph.node_copy(node, env.__getitem__)
    graph.output([env[_marked(o)] for o in outputs])
    return torch.fx.GraphModule(module, graph)


def _marked(mark: torch.fx.Node) -> torch.fx.Node:
    source = mark.args[0]
    assert isinstance(source, torch.fx.Node)
    return source


def _decomposition(body: torch.fx.GraphModule) -> Any:
    run = libtpu.jax_function(body)
    # The attributes come as keyword arguments; the body does not read them.
    return lambda *arrays, **_: run(*arrays)


def with_composites(module: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``module`` with each marked pattern instance as one call of a jax composite, and every
    other mark as the value it marks."""
    if not any(_is_mark(n) for n in module.graph.nodes):
        return module
    module = torch.fx.GraphModule(module, copy.deepcopy(module.graph))
    graph = module.graph
    for instance in _instances(graph):
        attrs = {k: _attribute(v) for k, v in instance.attr.items()}
        composite = lax.composite(_decomposition(_body(instance, module)), name=instance.name)

        def call(*tensors: Any, _composite: Any = composite, _attrs: Any = attrs) -> Any:
            return _composite(*tensors, **_attrs)

        sources = tuple(instance.inputs[p].args[0] for p in sorted(instance.inputs))
        outputs = [instance.outputs[p] for p in sorted(instance.outputs)]
        first = next(n for n in graph.nodes if n in outputs)
        with graph.inserting_before(first):
            results = graph.call_function(call, sources)
            for index, mark in enumerate(outputs):
                mark.replace_all_uses_with(graph.call_function(operator.getitem, (results, index)))
    for node in list(graph.nodes):
        if _is_mark(node):
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
    graph.eliminate_dead_code()
    module.recompile()
    return module


_COMPOSITE = re.compile(r'stablehlo\.composite "([^"]+)".*?decomposition = @([\w.$-]+)')


def torch_xla_names(text: str) -> str:
    """``text`` with each composite's body function named as torch_xla names it."""
    renames: dict[str, str] = {}
    for name, body in _COMPOSITE.findall(text):
        if body == name:
            renames[body] = f"{name}.impl"
        elif body.startswith(name + "_"):
            renames[body] = f"{name}.impl{body[len(name) :]}"
    for old, new in renames.items():
        text = re.sub(rf"@{re.escape(old)}(?![\w.$-])", f"@{new}", text)
    return text
