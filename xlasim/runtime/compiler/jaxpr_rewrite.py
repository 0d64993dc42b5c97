"""A JAX function's jaxpr evaluated again with two of its ops changed, for running it on the CPU
in place of a TPU.

Float32 matmuls as a TPU's matrix unit computes them (``tpu_matmuls``): XLA:CPU ignores a dot's
precision and multiplies float32 exactly; a TPU runs a float32 ``dot_general`` or convolution at
the dot's precision (or JAX's ``jax_default_matmul_precision`` where the dot names none):
``DEFAULT`` one pass over operands rounded to bfloat16, ``HIGH`` three bfloat16 products (the
operands split in two, as ``xlasim.runtime.numerics`` describes for torch_xla's ``high``),
``HIGHEST`` six, within a float32 rounding of the exact product, which is what the CPU computes
for it here.

Sharding constraints dropped (``drop_constraints``): a constraint over the slice's TPU devices
leaves values as they are, and the CPU has no such devices; nested jitted calls are inlined for
the same reason (their shardings name the slice's devices too).

The ops are replaced inside nested calls, loops and branches too. Part of the optional
TPU-compiler layer: importing this module imports jax.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from xlasim.runtime.compiler import libtpu  # noqa: F401 - jax as the layer sets it up

# isort: split
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core as jex_core

_MATMULS = ("dot_general", "conv_general_dilated")
# jax_default_matmul_precision's names for each level.
_CONFIG_LEVELS = {
    None: "default",
    "default": "default",
    "fastest": "default",
    "bfloat16": "default",
    "high": "high",
    "bfloat16_3x": "high",
    "tensorfloat32": "high",
    "highest": "highest",
    "float32": "highest",
}
_PRECISION_LEVELS = {
    lax.Precision.DEFAULT: "default",
    lax.Precision.HIGH: "high",
    lax.Precision.HIGHEST: "highest",
}


def _level(precision: Any) -> str:
    """The level of a dot: the higher of its operands' precisions, else JAX's default."""
    if precision is None:
        configured = jax.config.jax_default_matmul_precision
        return _CONFIG_LEVELS.get(configured, "highest")
    if isinstance(precision, lax.Precision):
        return _PRECISION_LEVELS[precision]
    if isinstance(precision, tuple) and all(isinstance(p, lax.Precision) for p in precision):
        levels = [_PRECISION_LEVELS[p] for p in precision]
        return max(levels, key=["default", "high", "highest"].index)
    return "highest"  # a DotAlgorithm: its own algorithm, not emulated here


def _bf16(x: Any) -> Any:
    return x.astype(jnp.bfloat16).astype(jnp.float32)


def _cut(x: Any) -> Any:
    """``x``'s upper 16 bits (the leading part of a two-way split)."""
    bits = lax.bitcast_convert_type(x, jnp.uint32) & np.uint32(0xFFFF0000)
    return lax.bitcast_convert_type(bits, jnp.float32)


def _emulated(prim: Any, a: Any, b: Any, params: dict[str, Any]) -> Any:
    level = _level(params.get("precision"))
    if level == "highest" or a.dtype != jnp.float32 or b.dtype != jnp.float32:
        return prim.bind(a, b, **params)
    exact = {**params, "precision": (lax.Precision.HIGHEST, lax.Precision.HIGHEST)}
    if level == "default":
        return prim.bind(_bf16(a), _bf16(b), **exact)
    a0, b0 = _cut(a), _cut(b)
    a1, b1 = _bf16(a - a0), _bf16(b - b0)
    return prim.bind(a0, b0 + b1, **exact) + prim.bind(a1, b0, **exact)


def _has_matmul(jaxpr: Any) -> bool:
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in _MATMULS:
            return True
        for sub in jax.tree.leaves(eqn.params, is_leaf=_is_jaxpr):
            if isinstance(sub, jex_core.ClosedJaxpr) and _has_matmul(sub.jaxpr):
                return True
    return False


def _is_jaxpr(x: Any) -> bool:
    return isinstance(x, (jex_core.ClosedJaxpr, jex_core.Jaxpr))


class _Rewrite:
    def __init__(self, tpu_matmuls: bool, drop_constraints: bool) -> None:
        self.tpu_matmuls = tpu_matmuls
        self.drop_constraints = drop_constraints

    def closed(self, closed: Any) -> Any:
        avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in closed.jaxpr.invars]

        def run(*args: Any) -> list[Any]:
            return self.evaluate(closed.jaxpr, closed.consts, args)

        return jax.make_jaxpr(run)(*avals)

    def param(self, value: Any) -> Any:
        if isinstance(value, jex_core.ClosedJaxpr):
            return self.closed(value)
        if isinstance(value, tuple) and any(isinstance(v, jex_core.ClosedJaxpr) for v in value):
            return tuple(self.param(v) for v in value)
        return value

    def evaluate(self, jaxpr: Any, consts: Sequence[Any], args: Sequence[Any]) -> list[Any]:
        env: dict[Any, Any] = {}

        def read(var: Any) -> Any:
            return var.val if isinstance(var, jex_core.Literal) else env[var]

        env.update(zip(jaxpr.constvars, consts, strict=True))
        env.update(zip(jaxpr.invars, args, strict=True))
        for eqn in jaxpr.eqns:
            inputs = [read(v) for v in eqn.invars]
            prim = eqn.primitive
            if self.tpu_matmuls and prim.name in _MATMULS:
                left, right = inputs
                outputs = [_emulated(prim, left, right, eqn.params)]
            elif self.drop_constraints and prim.name == "sharding_constraint":
                outputs = inputs
            elif self.drop_constraints and prim.name == "jit":
                inner = eqn.params["jaxpr"]
                outputs = self.evaluate(inner.jaxpr, inner.consts, inputs)
            else:
                params = {k: self.param(v) for k, v in eqn.params.items()}
                with eqn.ctx.manager:
                    result = prim.bind(*inputs, **prim.get_bind_params(params))
                outputs = list(result) if prim.multiple_results else [result]
            for var, value in zip(eqn.outvars, outputs, strict=True):
                env[var] = value
        return [read(v) for v in jaxpr.outvars]


def evaluator(
    closed: Any, *, tpu_matmuls: bool, drop_constraints: bool
) -> Callable[[Sequence[Any]], list[Any]]:
    """A function of ``closed``'s flat inputs computing its flat outputs, with the changes
    asked for (``closed`` itself where none is)."""
    if not (tpu_matmuls and _has_matmul(closed.jaxpr)) and not drop_constraints:
        whole = jex_core.jaxpr_as_fun(closed)
        return lambda args: list(whole(*args))
    rewrite = _Rewrite(tpu_matmuls, drop_constraints)
    return lambda args: rewrite.evaluate(closed.jaxpr, closed.consts, args)
