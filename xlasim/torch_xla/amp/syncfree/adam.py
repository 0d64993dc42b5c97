"""``torch_xla.amp.syncfree.Adam``."""

from __future__ import annotations

from typing import Any

import torch

from ._adam_family import fused_adam_step


class Adam(torch.optim.Adam):
    """``torch.optim.Adam`` whose ``step(found_inf=t)`` skips on device when ``t != 0``."""

    @torch.no_grad()
    def step(self, closure: Any = None, found_inf: torch.Tensor | None = None) -> Any:
        if found_inf is None:
            return super().step(closure=closure)
        return fused_adam_step(self, found_inf, closure, use_adamw=False)
