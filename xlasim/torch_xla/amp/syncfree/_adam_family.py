"""The shared ``step`` of the sync-free Adam and AdamW."""

from __future__ import annotations

from typing import Any

import torch

from . import _base, _functional


def fused_adam_step(
    optimizer: torch.optim.Optimizer, found_inf: torch.Tensor, closure: Any, use_adamw: bool
) -> Any:
    _base.checked_found_inf(found_inf)
    loss = _base.run_closure(closure)
    name = "AdamW" if use_adamw else "Adam"
    for group in optimizer.param_groups:
        params = _base.params_with_grads(group, name)
        states = [optimizer.state[p] for p in params]
        for p, state in zip(params, states, strict=True):
            if not state:
                state["step"] = torch.zeros_like(found_inf)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                # Without amsgrad the kernel never reads it: an empty placeholder.
                state["max_exp_avg_sq"] = (
                    torch.zeros_like(p, memory_format=torch.preserve_format)
                    if group["amsgrad"]
                    else torch.empty(0, dtype=torch.float, device="xla")
                )
        beta1, beta2 = group["betas"]
        _functional.adam_step(
            found_inf,
            [s["step"] for s in states],
            params,
            [g for p in params if (g := p.grad) is not None],
            [s["exp_avg"] for s in states],
            [s["exp_avg_sq"] for s in states],
            [s["max_exp_avg_sq"] for s in states],
            amsgrad=group["amsgrad"],
            beta1=beta1,
            beta2=beta2,
            lr=group["lr"],
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=group["maximize"],
            use_adamw=use_adamw,
        )
    return loss
