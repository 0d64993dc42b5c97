"""An op of an exported graph written as ``stablehlo.custom_call @<op name>``: what torch_xla
does for the ops of ``StableHLOExportOptions.custom_ops_allowed_in_graph`` (learned from
torch_xla 2.9's text: the op's qualified overload name as the target, API version 0, an empty
backend config, and several results as one tuple unpacked with ``get_tuple_element``).

Part of the optional TPU-compiler layer: importing it imports jax.  Only lowering is defined;
the call has no kernel to run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# First, as in ``stablehlo``: jax must be imported inside libtpu's load environment.
from xlasim.runtime.compiler import libtpu  # noqa: F401

# isort: split
import jax.numpy as jnp
import torch
from jax._src import core
from jax._src.interpreters import mlir
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import hlo

from xlasim.runtime.compiler import aten_to_jax

_custom_call = core.Primitive("xlasim_stablehlo_custom_call")
_custom_call.multiple_results = True


def _abstract(*_: Any, target: str, outputs: tuple[tuple[tuple[int, ...], Any], ...]) -> Any:
    return [core.ShapedArray(shape, dtype) for shape, dtype in outputs]


def _lowering(ctx: Any, *operands: Any, target: str, outputs: Any) -> Sequence[Any]:
    types = [mlir.aval_to_ir_type(ctx.module_context, aval) for aval in ctx.avals_out]
    if len(types) == 1:
        return mlir.custom_call(
            target, result_types=types, operands=list(operands), api_version=0
        ).results
    packed = ir.TupleType.get_tuple(types)
    call = mlir.custom_call(target, result_types=[packed], operands=list(operands), api_version=0)
    return [hlo.get_tuple_element(call.result, i) for i in range(len(types))]


_custom_call.def_abstract_eval(_abstract)
mlir.register_lowering(_custom_call, _lowering)


def custom_call_of(node: torch.fx.Node) -> Any:
    """A function of ``node``'s tensor arguments (in order) that is the custom call for its op,
    with the result shapes and dtypes of the node's example value."""
    value = node.meta["val"]
    values = [value] if isinstance(value, torch.Tensor) else list(value)
    outputs = tuple(
        (tuple(int(d) for d in v.shape), jnp.dtype(aten_to_jax.jax_dtype(v.dtype))) for v in values
    )
    single = isinstance(value, torch.Tensor)
    target = str(node.target)

    def call(*args: Any, **kwargs: Any) -> Any:
        tensors = [a for a in (*args, *kwargs.values()) if hasattr(a, "shape")]
        results = _custom_call.bind(*tensors, target=target, outputs=outputs)
        return results[0] if single else tuple(results)

    return call
