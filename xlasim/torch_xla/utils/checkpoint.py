"""``torch_xla.utils.checkpoint``: activation checkpointing (reentrant) for XLA devices.

The forward runs without keeping activations; backward runs the function again with grad,
under the RNG states and autocast settings of the first run, then back-propagates through the
rerun. Before the rerun torch_xla fences the saved inputs, the incoming gradients and, for a
bound method of a module, its parameters and buffers with an optimization barrier, so that
XLA does not merge the rerun with the first forward; the simulator records that barrier as
torch_xla does (it changes no value). ``chkpt_status.in_chkpt_bwd`` tells FSDP that a rerun is
under way. Only ``use_reentrant=True`` exists on XLA.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

import torch
import torch_xla.core.xla_model as xm
from torch.utils.checkpoint import check_backward_validity, detach_variable

__all__ = [
    "CheckpointFunction",
    "CheckpointStatus",
    "checkpoint",
    "chkpt_status",
    "get_device_states",
    "set_device_states",
]

# Autocast settings a rerun restores, per device type present on a TPU VM.
_AUTOCAST_DEVICES = ("cpu", "xla")
_CPU = torch.device("cpu")


class CheckpointStatus:
    """Whether a checkpointed function is being rerun by backward."""

    def __init__(self) -> None:
        self.in_chkpt_bwd = False


chkpt_status = CheckpointStatus()


def get_device_states(*args: Any) -> tuple[list[torch.device], list[int]]:
    """The devices (other than the CPU) holding tensors among ``args``, with each one's RNG
    state; XLA states are ints (the seed)."""
    devices = list({a.device for a in args if isinstance(a, torch.Tensor)} - {_CPU})
    if any(d.type != "xla" for d in devices):
        raise NotImplementedError(
            "xlasim simulates RNG states of XLA devices only (no other accelerator exists "
            "on a TPU VM)"
        )
    return devices, [xm.get_rng_state(str(d)) for d in devices]


def set_device_states(devices: list[torch.device], states: list[int]) -> None:
    for device, state in zip(devices, states, strict=True):
        xm.set_rng_state(state, device=str(device))


def _tensors(values: Iterable[Any]) -> list[torch.Tensor]:
    return [v for v in values if isinstance(v, torch.Tensor)]


class CheckpointFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, run_function: Any, preserve_rng_state: bool, *args: Any) -> Any:
        check_backward_validity(args)
        ctx.run_function = run_function
        ctx.preserve_rng_state = preserve_rng_state
        ctx.autocast = [
            {
                "device_type": device,
                "enabled": torch.is_autocast_enabled(device),
                "dtype": torch.get_autocast_dtype(device),
                "cache_enabled": torch.is_autocast_cache_enabled(),
            }
            for device in _AUTOCAST_DEVICES
        ]
        if preserve_rng_state:
            ctx.rng = (xm.get_rng_state(), torch.get_rng_state())
        # Tensors go through save_for_backward; the other arguments stay as they are.
        ctx.is_tensor = [isinstance(a, torch.Tensor) for a in args]
        ctx.others = [None if is_t else a for a, is_t in zip(args, ctx.is_tensor, strict=True)]
        ctx.save_for_backward(*_tensors(args))
        with torch.no_grad():
            return run_function(*args)

    @staticmethod
    def backward(ctx: Any, *grad_outputs: Any) -> Any:
        # Set before any check: a rerun that fails leaves it set (as torch_xla 2.9 does).
        chkpt_status.in_chkpt_bwd = True
        if not torch.autograd._is_checkpoint_valid():
            raise RuntimeError(
                "Checkpointing is not compatible with .grad() or when an `inputs` parameter"
                " is passed to .backward(). Please use .backward() and do not pass its "
                "`inputs` argument."
            )
        saved = iter(ctx.saved_tensors)
        inputs = [
            next(saved) if is_t else o for is_t, o in zip(ctx.is_tensor, ctx.others, strict=True)
        ]
        fenced = _tensors(inputs) + _tensors(grad_outputs)
        owner = getattr(ctx.run_function, "__self__", None)
        if inspect.ismethod(ctx.run_function) and isinstance(owner, torch.nn.Module):
            fenced += list(owner.parameters()) + list(owner.buffers())
        xm.optimization_barrier_(fenced)
        preserve = ctx.preserve_rng_state
        with torch.random.fork_rng(devices=[], enabled=preserve), xm.fork_rng(enabled=preserve):
            if preserve:
                xm.set_rng_state(ctx.rng[0])
                torch.set_rng_state(ctx.rng[1])
            detached = detach_variable(tuple(inputs))
            with torch.enable_grad():
                autocasts = [torch.autocast(**kwargs) for kwargs in ctx.autocast]
                for a in autocasts:
                    a.__enter__()
                try:
                    outputs = ctx.run_function(*detached)
                finally:
                    for a in reversed(autocasts):
                        a.__exit__(None, None, None)
        if isinstance(outputs, torch.Tensor):
            outputs = (outputs,)
        pairs = [
            (out, grad)
            for out, grad in zip(outputs, grad_outputs, strict=False)
            if isinstance(out, torch.Tensor) and out.requires_grad
        ]
        if not pairs:
            raise RuntimeError(
                "none of output has requires_grad=True, this checkpoint() is not necessary"
            )
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        chkpt_status.in_chkpt_bwd = False
        grads = tuple(d.grad if isinstance(d, torch.Tensor) else None for d in detached)
        return (None, None, *grads)


def checkpoint(function: Any, *args: Any, use_reentrant: bool = True, **kwargs: Any) -> Any:
    """Runs ``function(*args)`` without keeping its activations; backward recomputes them.
    ``preserve_rng_state`` (default True) reruns it with the random state of the first run."""
    preserve = kwargs.pop("preserve_rng_state", True)
    if kwargs:
        raise ValueError("Unexpected keyword arguments: " + ",".join(kwargs))
    if not use_reentrant:
        raise ValueError("XLA currently does not support use_reentrant==False")
    return CheckpointFunction.apply(function, preserve, *args)
