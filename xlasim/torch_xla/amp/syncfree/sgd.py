"""``torch_xla.amp.syncfree.SGD``."""

from __future__ import annotations

from typing import Any

import torch

from . import _base, _functional


class SGD(torch.optim.SGD):
    """``torch.optim.SGD`` whose ``step(found_inf=t)`` skips on device when ``t != 0``."""

    @torch.no_grad()
    def step(self, closure: Any = None, found_inf: torch.Tensor | None = None) -> Any:
        if found_inf is None:
            return super().step(closure=closure)
        _base.checked_found_inf(found_inf)
        loss = _base.run_closure(closure)
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            states = [self.state[p] for p in params]
            for state in states:
                if "step" not in state:
                    state["step"] = torch.zeros_like(found_inf)
            buffers = [state.get("momentum_buffer") for state in states]
            _functional.sgd_step(
                found_inf,
                [s["step"] for s in states],
                params,
                [g for p in params if (g := p.grad) is not None],
                buffers,
                group,
            )
            for state, buf in zip(states, buffers, strict=True):
                state["momentum_buffer"] = buf
        return loss
