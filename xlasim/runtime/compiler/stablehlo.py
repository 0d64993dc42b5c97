"""An exported program's core-ATen FX graph as StableHLO (text and MLIR bytecode), lowered by
jax: the graph's ops go through ``aten_to_jax`` and jax's own lowering writes the module.

Part of the optional TPU-compiler layer (the ``tpu-compiler`` extra): importing it imports jax.
Only the export path's text and bytecode need it; running an exported program does not.
The module is jax's lowering of the same computation, not a copy of torch_xla's (value names,
constant folding and the module's name differ); an op with no lowering raises
``NotImplementedError`` naming it.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# libtpu.py sets jax up for compiling only (CPU platform, 64-bit integers kept); lowering needs
# the same settings, so it is imported for them and for its FX-to-jax walk. First: jax must be
# imported inside libtpu's load environment, or loading libtpu leaves TPU variables behind.
from xlasim.runtime.compiler import libtpu

# isort: split
import jax
import torch
from jax import export
from jax._src.interpreters import mlir
from jax._src.lib.mlir import ir

from xlasim.runtime.compiler import aten_to_jax, composite, custom_call


@dataclass(frozen=True)
class Lowered:
    text: str
    bytecode: bytes


def lower_graph(
    module: torch.fx.GraphModule,
    fixed: dict[int, Any],
    order: Sequence[int],
    inputs: Sequence[tuple[Sequence[int | str], torch.dtype]],
    custom_namespaces: frozenset[str] = frozenset(),
) -> Lowered:
    """``module`` as a StableHLO function of ``inputs`` (shape, dtype), one per placeholder that
    ``fixed`` (placeholder position -> Python value baked into the program) does not name, in
    the order ``order`` gives (the placeholders' positions).

    A dimension given as a string is dynamic: the expression of export's symbols (``s0``,
    ``2*s0``) it stands for. Such dimensions are ``?`` in the module's types, and dimensions
    named by the same symbol are one size (jax's shape polymorphism computes the rest).

    The ops of the namespaces in ``custom_namespaces`` are written as custom calls, and pattern
    instances marked with ``xla::mark_tensor`` as composites."""
    if custom_namespaces:
        module = _with_custom_calls(module, custom_namespaces)
    module = composite.with_composites(module)
    with libtpu.wide_integers():
        return _lower(module, fixed, order, inputs)


def _with_custom_calls(
    module: torch.fx.GraphModule, namespaces: frozenset[str]
) -> torch.fx.GraphModule:
    graph = copy.deepcopy(module.graph)
    for node in graph.nodes:
        target = node.target
        if isinstance(target, torch._ops.OpOverload) and target.namespace in namespaces:
            node.target = custom_call.custom_call_of(node)
    return torch.fx.GraphModule(module, graph)


def _lower(
    module: torch.fx.GraphModule,
    fixed: dict[int, Any],
    order: Sequence[int],
    inputs: Sequence[tuple[Sequence[int | str], torch.dtype]],
) -> Lowered:
    run_graph = libtpu.jax_function(module)
    positions = sum(1 for n in module.graph.nodes if n.op == "placeholder")

    def program(*arrays: Any) -> list[Any]:
        values = [fixed.get(i) for i in range(positions)]
        for position, array in zip(order, arrays, strict=True):
            values[position] = array
        return run_graph(*values)

    scope = export.SymbolicScope()
    avals = [
        jax.ShapeDtypeStruct(_shape(shape, scope), aten_to_jax.jax_dtype(dtype))
        for shape, dtype in inputs
    ]
    if all(isinstance(d, int) for aval in avals for d in aval.shape):
        text = jax.jit(program).lower(*avals).as_text()
    else:
        # Symbolic sizes: jit's lowering would take each one as an extra argument; export's
        # module takes only the arrays and reads the sizes from their shapes.
        text = export.export(jax.jit(program))(*avals).mlir_module()
    with mlir.make_ir_context():
        parsed = ir.Module.parse(composite.torch_xla_names(text))
        return Lowered(
            parsed.operation.get_asm(enable_debug_info=False), mlir.module_to_bytecode(parsed)
        )


def _shape(shape: Sequence[int | str], scope: export.SymbolicScope) -> tuple[Any, ...]:
    if all(isinstance(d, int) for d in shape):
        return tuple(shape)
    spec = ", ".join(str(d) for d in shape)
    return tuple(export.symbolic_shape(spec, scope=scope))
