"""The ``xla::<kernel>`` counter torch_xla bumps each time one of its XLA kernels runs.

Every kernel of torch_xla's ``XLANativeFunctions`` counts its own calls under ``xla::`` and
its C++ name: the aten op's name without the overload (``add.Tensor`` and ``add.Scalar`` both
count ``xla::add``), with ``_symint`` appended for the kernels torch_xla takes SymInt sizes in
(``_SYMINT_KERNELS``). What reaches those kernels is what functionalization hands over:

* a view op arrives as its ``_copy`` variant (``t`` counts ``xla::t_copy``);
* an in-place or ``out=`` op whose functional form torch_xla lowers arrives as that form, and
  functionalization then moves the result into the written tensor with
  ``_propagate_xla_data`` (``add_`` counts ``xla::add`` and ``xla::_propagate_xla_data``);
* an in-place op torch_xla lowers as such (``zero_``, ``normal_``, ``fill_``) arrives through
  its functional composite: a clone of the input, then the in-place kernel on the clone.

(Real torch_xla 2.9 on CPU: ``a.add_(b)``, ``a.t()``, ``torch.zeros(3, device=d)``.)

Not yet accounted: functionalization regenerates a view from its base when the base changed
or the view is read again (real torch_xla then counts the ``_copy`` kernel once more), and an
op run through a CompositeExplicitAutograd kernel counts the kernels that composite calls.
"""

from __future__ import annotations

from typing import Any

import torch

from xlasim.runtime.lowerings import fallback_name, lowered

# The kernels of torch_xla 2.9's XLANativeFunctions whose C++ names end in ``_symint`` (read
# from the symbols of the real package's ``_XLAC`` extension).
_SYMINT_KERNELS = frozenset(
    {
        "diagonal_backward",
        "embedding",
        "empty_strided",
        "empty",
        "expand_copy",
        "expand",
        "narrow_copy",
        "new_empty_strided",
        "select_backward",
        "select",
        "view_copy",
        "view",
    }
)

# In-place ops torch_xla has a kernel of its own for and no kernel for their functional form
# (the same symbols; real torch_xla 2.9 counts ``xla::zero_`` for ``torch.zeros``).
_INPLACE_KERNELS = frozenset(
    {
        "_amp_foreach_non_finite_check_and_unscale_",
        "_amp_update_scale_",
        "_index_put_impl_",
        "exponential_",
        "fill_",
        "index_fill_",
        "index_put_",
        "normal_",
        "put_",
        "random_",
        "uniform_",
        "zero_",
    }
)

# ``out=`` ops torch_xla has a kernel of their own for (the same symbols).
_OUT_KERNELS = frozenset({"arange", "eye", "max", "min", "mv"})

_PROPAGATE = "xla::_propagate_xla_data"

# Ops whose counters follow no rule above (real torch_xla 2.9 on CPU): a copy into an xla
# tensor is functionalized into ``copy`` (which copies with ``_copy_from``); reading a scalar
# runs torch_xla's CPU fallback of ``_local_scalar_dense`` after a ``_to_cpu``; a new tensor
# from data (``torch.tensor(..., device=)``) is lifted by ``lift_fresh``.
_OWN = {
    "copy_": ("xla::copy", "xla::_copy_from", _PROPAGATE),
    "_local_scalar_dense": ("xla::_to_cpu",),
    "lift_fresh": ("xla::lift_fresh",),
}

COPY_TO_HOST = ("xla::copy_", "xla::_copy_from")
"""A ``copy_`` into a CPU tensor from an xla one: torch_xla's own ``copy_`` runs, outside
functionalization."""

EMPTY = "xla::empty_symint"
EMPTY_STRIDED = "xla::empty_strided_symint"


def _counter(name: str) -> str:
    return f"xla::{name}_symint" if name in _SYMINT_KERNELS else f"xla::{name}"


def kernel_counters(op: Any) -> tuple[str, ...]:
    """The counters one call of ``op`` on xla tensors bumps (none for an op torch_xla does not
    lower: its CPU fallback counts ``aten::`` instead)."""
    if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten":
        return ()
    if fallback_name(op) is not None or not lowered(op):
        return ()
    schema = op._schema
    name = schema.name.removeprefix("aten::")
    if name in _OWN:
        return _OWN[name]
    if schema.is_mutable:
        if name in _OUT_KERNELS:
            return (f"xla::{name}_out", _PROPAGATE)
        if name in _INPLACE_KERNELS:
            return ("xla::clone", _counter(name), _PROPAGATE)
        return (_counter(name.removesuffix("_")), _PROPAGATE)
    if any(r.alias_info is not None for r in schema.returns):
        return (_counter(f"{name}_copy"),)
    return (_counter(name),)
