"""Per-parameter application of the fused ``_XLAC`` updates (torch_xla's functional API)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch_xla


def adam_step(
    found_inf: torch.Tensor,
    state_steps: list[torch.Tensor],
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    max_exp_avg_sqs: list[torch.Tensor],
    *,
    amsgrad: bool,
    beta1: float,
    beta2: float,
    lr: float,
    weight_decay: float,
    eps: float,
    maximize: bool,
    use_adamw: bool,
) -> None:
    per_param = zip(state_steps, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, strict=True)
    for step, param, grad, avg, avg_sq, max_avg_sq in per_param:
        torch_xla._XLAC._xla_adam_optimizer_step_(
            found_inf, step, param, grad, avg, avg_sq, max_avg_sq,
            beta1, beta2, lr, weight_decay, eps, amsgrad, maximize, use_adamw,
        )  # fmt: skip


def sgd_step(
    found_inf: torch.Tensor,
    state_steps: list[torch.Tensor],
    params: list[torch.Tensor],
    d_p_list: list[torch.Tensor],
    momentum_buffer_list: list[torch.Tensor | None],
    group: Mapping[str, Any],
) -> None:
    """One fused update per parameter with the hyperparameters of its ``torch.optim.SGD``
    param ``group``; fills ``momentum_buffer_list``'s empty slots with a copy of the gradient
    first."""
    hyper = [group[k] for k in ("weight_decay", "momentum", "lr", "dampening", "nesterov")]
    for i, (step, param, d_p) in enumerate(zip(state_steps, params, d_p_list, strict=True)):
        if momentum_buffer_list[i] is None:
            momentum_buffer_list[i] = torch.clone(d_p).detach()
        torch_xla._XLAC._xla_sgd_optimizer_step_(
            found_inf, step, param, momentum_buffer_list[i], d_p, *hyper, group["maximize"]
        )
