"""``xla::place_to_host`` and ``xla::place_to_device``: torch_xla's host-offloading ops, which
annotate a value to live in the host's pinned memory or in device memory (an
``annotate_device_placement`` custom call).  Defined once per process: the mirrored
``torch_xla.experimental.stablehlo_custom_call`` is loaded again for each simulation.

The annotation does not change the value, so the simulator computes each as a copy of its
input; where XLA keeps the buffer (host or device memory) is not simulated.  Gradients flow
through both unchanged, as in torch_xla.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.library import custom_op


@custom_op("xla::place_to_host", mutates_args=())
def place_to_host(t: Tensor) -> Tensor:
    return t.clone()


@custom_op("xla::place_to_device", mutates_args=())
def place_to_device(t: Tensor) -> Tensor:
    return t.clone()


def _like(t: Tensor) -> Tensor:
    return torch.empty_like(t)


def _grad_unchanged(ctx: Any, grad: Tensor) -> Tensor:
    return grad


for _op in (place_to_host, place_to_device):
    _op.register_fake(_like)
    _op.register_autograd(_grad_unchanged)
