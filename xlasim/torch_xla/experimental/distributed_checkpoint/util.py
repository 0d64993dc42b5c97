"""``prime_optimizer``: create an optimizer's state so a checkpoint can be loaded into it."""

from __future__ import annotations

import torch
import torch_xla
import torch_xla.core.xla_model as xm
from torch.utils._pytree import tree_map


def prime_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Runs one optimizer step with all-zero gradients and returns the optimizer.

    Optimizers create their state at their first step, and distributed checkpoints load in
    place, so the state must exist before a restore. The step can still change the state and
    the parameters (e.g. weight decay): call this only right before restoring both.
    """
    torch_xla.sync()
    xm.wait_device_ops()

    def zero_grad(x: object) -> object:
        if isinstance(x, torch.Tensor) and x.requires_grad:
            x.grad = torch.zeros_like(x, requires_grad=False)
            sharding = torch_xla._XLAC._get_xla_op_sharding(x)
            if sharding:
                # The gradient is sharded as its parameter is.
                torch_xla._XLAC._xla_mark_sharding(x.grad, sharding)
        return x

    tree_map(zero_grad, optimizer.param_groups)
    optimizer.step()
    torch_xla.sync()
    xm.wait_device_ops()
    return optimizer
