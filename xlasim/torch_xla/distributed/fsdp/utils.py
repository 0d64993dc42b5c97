"""``checkpoint_module``: activation checkpointing of a module's forward."""

from __future__ import annotations

from types import MethodType
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = ["checkpoint_module"]


def checkpoint_module(module: nn.Module) -> nn.Module:
    """Make ``module``'s forward keep no activations for backward (they are recomputed
    there) whenever an input requires grad; returns ``module``, changed in place.

    The original forward stays reachable as ``module._xla_checkpointed_forward_original``.
    Recomputation changes what the compiled graph keeps live, not the values: outputs and
    gradients equal those of the plain forward.
    """
    original = module.forward

    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        inputs = [*args, *kwargs.values()]
        if any(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs):
            return checkpoint(original, *args, use_reentrant=False, **kwargs)
        return original(*args, **kwargs)

    module._xla_checkpointed_forward_original = original  # type: ignore[assignment]
    module.forward = MethodType(forward, module)  # type: ignore[method-assign]
    return module
