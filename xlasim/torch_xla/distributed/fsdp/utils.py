"""``checkpoint_module``: activation checkpointing of a module's forward; and the
``nn.Linear`` forward patch whose backward uses the weight parameter itself."""

from __future__ import annotations

from types import MethodType
from typing import Any

import torch
import torch_xla.core.xla_model as xm
from torch import nn

__all__ = ["XLAPatchedLinear", "apply_xla_patch_to_nn_linear", "checkpoint_module"]


class _Recompute(torch.autograd.Function):
    """Runs ``forward`` without keeping its activations and runs it again in backward, with
    the random numbers (dropout masks) and the autocast state of the first run.

    torch.utils.checkpoint does not serve here: saving the RNG state needs a ``torch.xla``
    device module, which torch_xla does not register.
    """

    @staticmethod
    def forward(ctx: Any, forward: Any, kwarg_names: tuple[str, ...], *flat: Any) -> Any:
        ctx.forward, ctx.kwarg_names = forward, kwarg_names
        ctx.seeds = (xm.get_rng_state(), torch.get_rng_state())
        ctx.autocast = (torch.is_autocast_enabled("xla"), torch.get_autocast_dtype("xla"))
        ctx.is_tensor = [isinstance(t, torch.Tensor) for t in flat]
        ctx.needs_grad = [isinstance(t, torch.Tensor) and t.requires_grad for t in flat]
        ctx.others = [None if is_t else t for t, is_t in zip(flat, ctx.is_tensor, strict=True)]
        ctx.save_for_backward(*[t for t in flat if isinstance(t, torch.Tensor)])
        with torch.no_grad():
            return _call(forward, kwarg_names, flat)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        saved = iter(ctx.saved_tensors)
        flat = [
            next(saved).detach().requires_grad_(needs) if is_t else other
            for is_t, needs, other in zip(ctx.is_tensor, ctx.needs_grad, ctx.others, strict=True)
        ]
        now = (xm.get_rng_state(), torch.get_rng_state())
        xm.set_rng_state(ctx.seeds[0])
        torch.set_rng_state(ctx.seeds[1])
        enabled, dtype = ctx.autocast
        try:
            with torch.enable_grad(), torch.autocast("xla", dtype=dtype, enabled=enabled):
                outputs = _call(ctx.forward, ctx.kwarg_names, flat)
        finally:
            xm.set_rng_state(now[0])
            torch.set_rng_state(now[1])
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        pairs = [
            (out, grad)
            for out, grad in zip(outputs, grads, strict=False)
            if isinstance(out, torch.Tensor) and out.requires_grad and grad is not None
        ]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        input_grads = [t.grad if isinstance(t, torch.Tensor) else None for t in flat]
        return (None, None, *input_grads)


def _call(forward: Any, kwarg_names: tuple[str, ...], flat: Any) -> Any:
    cut = len(flat) - len(kwarg_names)
    return forward(*flat[:cut], **dict(zip(kwarg_names, flat[cut:], strict=True)))


def checkpoint_module(module: nn.Module) -> nn.Module:
    """Make ``module``'s forward keep no activations for backward (they are recomputed
    there) whenever an input requires grad; returns ``module``, changed in place.

    The original forward stays reachable as ``module._xla_checkpointed_forward_original``.
    Recomputation changes what the compiled graph keeps live, not the values: outputs and
    gradients equal those of the plain forward.
    """
    original = module.forward

    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        flat = (*args, *kwargs.values())
        if not any(isinstance(t, torch.Tensor) and t.requires_grad for t in flat):
            return original(*args, **kwargs)
        # Keyword values ride along as positional inputs, so that gradients reach them too.
        return _Recompute.apply(original, tuple(kwargs), *flat)

    module._xla_checkpointed_forward_original = original  # type: ignore[assignment]
    module.forward = MethodType(forward, module)
    return module


class XLAPatchedLinear(torch.autograd.Function):
    """``F.linear`` with its backward written out over the weight parameter it was given (not
    over a transposed copy autograd would keep), so a freed full parameter is not held."""

    @staticmethod
    def forward(ctx: Any, input: Any, weight: Any, bias: Any = None) -> Any:  # noqa: A002
        ctx.save_for_backward(input, weight, bias)
        with torch.no_grad():
            return torch._C._nn.linear(input, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad_output: Any) -> Any:
        x, weight, bias = ctx.saved_tensors
        # Leading dims are batch dims: flatten them so each gradient is one matmul.
        x2 = x.flatten(0, -2) if x.dim() > 2 else x
        g2 = grad_output.flatten(0, -2) if x.dim() > 2 else grad_output
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_input = g2.mm(weight)
            if x.dim() > 2:
                grad_input = grad_input.view(*x.shape[:-1], grad_input.shape[-1])
        if ctx.needs_input_grad[1]:
            grad_weight = g2.t().mm(x2)
        if bias is not None and ctx.needs_input_grad[2]:
            grad_bias = g2.sum(0)
        return grad_input, grad_weight, grad_bias


def _xla_patched_nn_linear_forward(m: nn.Module, input: Any) -> Any:  # noqa: A002
    return XLAPatchedLinear.apply(input, m.weight, m.bias)


def apply_xla_patch_to_nn_linear(
    module: nn.Module, patched_function: Any = _xla_patched_nn_linear_forward
) -> nn.Module:
    """Makes every ``nn.Linear`` in ``module`` (itself included) run ``patched_function`` as
    its forward, and returns ``module``.

    Only a forward that is still ``nn.Linear.forward`` is replaced (one changed by other means
    is left alone); the original stays as ``_nn_linear_forward_original``. A layer wrapped by
    ``checkpoint_module`` gets the patch on the forward it recomputes.
    """

    def patch(m: nn.Module, attr: str) -> None:
        current = getattr(m, attr, None)
        if current is None or getattr(current, "__func__", None) is not nn.Linear.forward:
            return
        m._nn_linear_forward_original = current
        setattr(m, attr, MethodType(patched_function, m))

    for m in module.modules():
        if isinstance(m, nn.Linear):
            patch(m, "forward")
            patch(m, "_xla_checkpointed_forward_original")
    return module
