"""``SeamlessOptimizer``: the user's optimizer, whose ``step()`` does what the device needs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tpu_backend.seamless.forwarding import Forwarded

__all__ = ["SeamlessOptimizer"]


class SeamlessOptimizer(torch.optim.Optimizer):
    """Holds the user's optimizer and shares its ``param_groups``, ``state`` and
    ``defaults``; only ``step()`` differs: it runs ``step(optimizer, closure)``.

    A real ``torch.optim.Optimizer`` subclass, because LR schedulers check ``isinstance``
    (HF accelerate's ``AcceleratedOptimizer`` is one for the same reason).
    """

    def __init__(self, optimizer: Any, step: Callable[[Any, Any], Any]) -> None:
        # No super().__init__: the wrapped optimizer owns the parameter groups.
        self.optimizer = optimizer
        self._step = step

    param_groups = Forwarded("optimizer", writable=True)
    state = Forwarded("optimizer", writable=True)
    defaults = Forwarded("optimizer", writable=True)

    def step(self, closure: Any = None) -> Any:
        return self._step(self.optimizer, closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(param_group)

    def state_dict(self) -> Any:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: Any) -> None:
        self.optimizer.load_state_dict(state_dict)

    def __getstate__(self) -> Any:
        return self.optimizer.__getstate__()

    def __repr__(self) -> str:
        return f"SeamlessOptimizer({self.optimizer!r})"
