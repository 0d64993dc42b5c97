"""torch_xla's fused sync-free optimizer updates (``_XLAC._xla_{adam,sgd}_optimizer_step_``).

torch_xla lowers each to one IR node whose XLA computation selects, elementwise, between the
old values and the updated ones on ``found_inf != 0``, so a step with an overflowed gradient
leaves every tensor as it was without the host ever reading ``found_inf``. The updates below
follow that lowering's arithmetic: the hyperparameters are constants of the tensors' dtype
(beta1, beta2 and lr of ``found_inf``'s, weight decay and eps of the parameter's), and the step
counter advances only on steps that are taken.
"""

from __future__ import annotations

import torch


def _const(like: torch.Tensor, value: float) -> torch.Tensor:
    return torch.full((), value, dtype=like.dtype, device=like.device)


@torch.no_grad()
def adam_step(
    found_inf: torch.Tensor,
    step: torch.Tensor,
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    max_exp_avg_sq: torch.Tensor,
    beta1: float,
    beta2: float,
    lr: float,
    weight_decay: float,
    eps: float,
    amsgrad: bool,
    maximize: bool,
    use_adamw: bool,
) -> None:
    skip = found_inf != 0
    if maximize:
        grad = grad * -1
    b1, b2, rate = (_const(found_inf, v) for v in (beta1, beta2, lr))
    decay, epsilon = _const(param, weight_decay), _const(param, eps)
    one = _const(param, 1.0)

    new_step = step + torch.logical_not(skip).to(param.dtype)
    correction1 = one - torch.pow(b1, new_step)
    correction2 = one - torch.pow(b2, new_step)

    base = param
    if weight_decay != 0:
        if use_adamw:
            base = torch.where(skip, param, param * (one - rate * decay))
        else:
            grad = torch.where(skip, grad, grad + param * decay)
    new_avg = torch.where(skip, exp_avg, exp_avg * b1 + grad * (one - b1))
    new_avg_sq = torch.where(skip, exp_avg_sq, exp_avg_sq * b2 + grad * grad * (one - b2))
    second = new_avg_sq
    if amsgrad:
        second = torch.where(skip, max_exp_avg_sq, torch.maximum(max_exp_avg_sq, new_avg_sq))
    denom = torch.sqrt(second) / torch.sqrt(correction2) + epsilon
    new_param = torch.where(skip, param, base - (rate / correction1) * (new_avg / denom))

    step.copy_(new_step)
    param.copy_(new_param)
    exp_avg.copy_(new_avg)
    exp_avg_sq.copy_(new_avg_sq)
    if amsgrad:
        max_exp_avg_sq.copy_(second)


@torch.no_grad()
def sgd_step(
    found_inf: torch.Tensor,
    step: torch.Tensor,
    param: torch.Tensor,
    buf: torch.Tensor,
    d_p: torch.Tensor,
    weight_decay: float,
    momentum: float,
    lr: float,
    dampening: float,
    nesterov: bool,
    maximize: bool,
) -> None:
    skip = found_inf != 0
    rate = _const(param, -lr if maximize else lr)
    one = _const(param, 1.0)
    update = d_p + param * _const(param, weight_decay) if weight_decay != 0 else d_p
    if momentum != 0:
        mom = _const(param, momentum)
        started = step != 0
        new_buf = torch.where(
            started, buf * mom + update * (one - _const(param, dampening)), update
        )
        update = update + new_buf * mom if nesterov else new_buf
        buf.copy_(torch.where(skip, buf, new_buf))
    param.copy_(torch.where(skip, param, param - update * rate))
    step.copy_(step + torch.logical_not(skip).to(param.dtype))
