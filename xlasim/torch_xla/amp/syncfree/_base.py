"""What the three sync-free optimizers share: the ``found_inf`` contract of ``step``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def checked_found_inf(found_inf: torch.Tensor) -> torch.Tensor:
    if found_inf.shape:
        raise ValueError("The found_inf tensor has to be scalar type")
    return found_inf


def run_closure(closure: Callable[[], Any] | None) -> Any:
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def params_with_grads(group: dict[str, Any], name: str) -> list[torch.Tensor]:
    params = [p for p in group["params"] if p.grad is not None]
    if any(p.grad.is_sparse for p in params):
        raise RuntimeError(
            f"{name} does not support sparse gradients"
            + (", please consider SparseAdam instead" if name == "Adam" else "")
        )
    return params
