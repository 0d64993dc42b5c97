"""Which aten ops torch_xla 2.9 lowers to XLA, and which run on its CPU fallback.

torch_xla registers an XLA kernel for the ops it lowers (``xla_kernels_2_9.txt``, recorded from
the real package). An op that reaches the XLA key without one runs on the CPU: torch_xla
computes the op's inputs (one graph), copies them to the host, runs the op there, and hands
back device tensors whose values wait on the host until their first use; it counts the call as
``aten::<op>[.<overload>]`` (``met.executed_fallback_ops()``).

What reaches the XLA key is not quite what a Python tensor subclass sees: torch_xla runs under
functionalization, so a view op arrives as its ``_copy`` variant and an in-place op as its
functional one; and an op with a CompositeExplicitAutograd kernel (``polar``) runs that kernel
first, which for most such ops creates the result and calls the op's ``out=`` variant.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import torch

from xlasim.runtime.dynamic_dims import EXPERIMENTS, experiment_on

KERNELS_FILE = Path(__file__).with_name("xla_kernels_2_9.txt")

_COMPOSITE = "CompositeExplicitAutograd"
_IMPLICIT = "CompositeImplicitAutograd"
_NON_FUNCTIONAL = "CompositeExplicitAutogradNonFunctional"


@cache
def _kernels() -> frozenset[str]:
    lines = KERNELS_FILE.read_text(encoding="utf-8").splitlines()
    return frozenset(line for line in lines if line and not line.startswith("#"))


def _qualified(op: Any) -> str:
    name = op._schema.name
    overload = op._overloadname
    return name if overload == "default" else f"{name}.{overload}"


def _with_name(op: Any, name: str) -> str:
    overload = op._overloadname
    return name if overload == "default" else f"{name}.{overload}"


def lowered(op: Any) -> bool:
    """Whether torch_xla has a kernel for ``op`` as functionalization hands it over."""
    kernels = _kernels()
    if _qualified(op) in kernels:
        return True
    schema = op._schema
    name = schema.name
    if schema.is_mutable and name.endswith("_"):
        return _with_name(op, name[:-1]) in kernels  # add_ -> add
    returns_alias = any(r.alias_info is not None for r in schema.returns)
    return returns_alias and _with_name(op, name + "_copy") in kernels  # t -> t_copy


def _has_composite(qualified: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(qualified, _COMPOSITE)


def _copy_of_lowered_view(op: Any) -> bool:
    """A ``<view>_copy`` op torch generates a kernel for (``lift_fresh_copy``): the kernel
    calls the view op and clones its result, so it runs on XLA where the view is lowered."""
    name = op._schema.name
    return (
        name.endswith("_copy")
        and torch._C._dispatch_has_kernel_for_dispatch_key(_qualified(op), _NON_FUNCTIONAL)
        and _with_name(op, name.removesuffix("_copy")) in _kernels()
    )


def fallback_name(op: Any) -> str | None:
    """The ``aten::`` counter torch_xla's CPU fallback counts for a call of ``op`` on xla
    tensors, or None when torch_xla lowers it (or composes it of ops it lowers). Worked out
    once per op: the dispatcher keeps it with the op's other facts."""
    if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten":
        return None
    if _qualified(op) in EXPERIMENTS:  # lowered with a dynamic output shape when asked for
        return None if experiment_on(_qualified(op)) else _qualified(op)
    if lowered(op):
        return None
    if torch._C._dispatch_has_kernel_for_dispatch_key(_qualified(op), _IMPLICIT):
        return None  # decomposed before any backend sees it
    if _copy_of_lowered_view(op):
        return None
    if not _has_composite(_qualified(op)):
        return _qualified(op)
    # A composite kernel: it falls back only through an out= variant with a CPU kernel.
    out = getattr(op.overloadpacket, "out", None)
    if out is None or lowered(out) or _has_composite(_qualified(out)):
        return None
    return _qualified(out)
