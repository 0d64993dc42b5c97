"""What importing torch_xla 2.9 replaces in torch: ``torch.nn.utils.clip_grad_norm_``.

torch_xla swaps in its own gradient clipping (keeping the original as ``_orig``): the norm and
the clipping stay on the device as xla ops, ``foreach=True`` is refused, and with no gradient
at all the zero norm it returns is an xla tensor (torch's is a CPU one). torch_xla also swaps
``torch.nn.GRU`` for its scan-based GRU (``torch_xla.experimental.gru``), torch's kept as
``_orig``; each import of the simulated torch_xla puts in its own.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch_xla.experimental.gru import GRU


def clip_grad_norm_(
    parameters: torch.Tensor | Iterable[torch.Tensor],
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
) -> torch.Tensor:
    if foreach:
        raise RuntimeError("foreach=True is not supported with XLA")
    params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    grads = [p.grad.detach() for p in params if p.grad is not None]
    max_norm, norm_type = float(max_norm), float(norm_type)
    if not grads:
        return torch.tensor(0.0).to("xla")
    dtype, device = grads[0].dtype, grads[0].device
    if norm_type == math.inf:
        total = grads[0].abs().max()
        for g in grads[1:]:
            total = torch.maximum(total, g.abs().max())
    else:
        per_grad = torch.stack([torch.linalg.vector_norm(g, norm_type) for g in grads])
        total = torch.linalg.vector_norm(per_grad, norm_type)
    if error_if_nonfinite and bool(total.isnan() or total.isinf()):
        raise RuntimeError(
            f"The norm of order {norm_type} for a gradient from `parameters` is non-finite, so "
            "it cannot be clipped. This error can be disabled with `error_if_nonfinite=False`"
        )
    coef = torch.tensor(max_norm, dtype=dtype, device=device) / (total + 1e-6)
    coef = torch.where(coef < 1, coef, torch.tensor(1.0, dtype=dtype, device=device))
    for g in grads:
        g.mul_(coef)
    return total


def _parameters(fn: Callable[..., Any]) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def _replace(original: Callable[..., Any], replacement: Callable[..., Any]) -> Callable[..., Any]:
    """``replacement`` keeping ``original`` as ``_orig``. torch_xla refuses a replacement whose
    signature differs from the function it replaces; compared here without the annotations,
    which this module writes as text."""
    if _parameters(original) != _parameters(replacement):
        raise RuntimeError(
            f"Unable to patch {original}, signature mismatch: {inspect.signature(original)} vs "
            f"{inspect.signature(replacement)}"
        )
    replacement._orig = original  # type: ignore[attr-defined]
    return replacement


def _apply_patches() -> None:
    if getattr(nn.utils.clip_grad_norm_, "_orig", None) is None:
        nn.utils.clip_grad_norm_ = _replace(nn.utils.clip_grad_norm_, clip_grad_norm_)
    GRU._orig = getattr(nn.GRU, "_orig", None) or nn.GRU
    nn.GRU = GRU  # type: ignore[misc]
