"""FSDP on the simulator: what is not simulated says so, and a deep copy of a device
model stays on the slice (torch's default copy of a tensor subclass duplicated its
runtime, leaving a tensor no simulated slice would take)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn


def test_collective_fsdp_is_refused_by_name(xlasim_sim):
    import torch_xla.distributed.fsdp as fsdp

    with pytest.raises(NotImplementedError, match=r"XlaFullyShardedDataParallel .*Spmd"):
        fsdp.XlaFullyShardedDataParallel(nn.Linear(2, 2))
    with pytest.raises(NotImplementedError, match=r"consolidate_sharded_model_checkpoints"):
        fsdp.consolidate_sharded_model_checkpoints("ckpt_prefix")
    with pytest.raises(NotImplementedError, match=r"consolidate_sharded_state_dicts"):
        fsdp.consolidate_sharded_state_dicts([], [])


def test_deepcopy_of_a_device_model_is_an_independent_clone(xlasim_sim):
    model = nn.Linear(4, 3).to("xla")
    model.weight.grad = torch.ones(3, 4, device="xla")
    twin = copy.deepcopy(model)
    assert twin.weight is not model.weight and twin.weight.requires_grad
    assert [name for name, _ in twin.named_parameters()] == ["weight", "bias"]
    torch.testing.assert_close(twin.weight.grad.cpu(), torch.ones(3, 4))
    x = torch.randn(2, 4, device="xla")
    torch.testing.assert_close(twin(x).cpu(), model(x).cpu())
    with torch.no_grad():
        twin.weight.add_(1.0)
    torch.testing.assert_close(twin.weight.cpu(), model.weight.cpu() + 1.0)
    # Two references to one tensor stay one tensor in the copy.
    pair = copy.deepcopy([model.bias, model.bias])
    assert pair[0] is pair[1]
