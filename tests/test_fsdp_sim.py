"""FSDP on the simulator: what is not simulated says so, a deep copy of a device model
stays on the slice (torch's default copy of a tensor subclass duplicated its runtime,
leaving a tensor no simulated slice would take), and checkpoint_module recomputes under the
forward's autocast (real torch_xla on CPU ignores autocast, so this is checked here)."""

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


def test_checkpointed_forward_is_recomputed_under_the_forward_autocast(xlasim_sim):
    import torch_xla
    import torch_xla.amp
    from torch_xla.distributed.fsdp import checkpoint_module

    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    checkpointed = copy.deepcopy(plain)
    plain, checkpointed = plain.to("xla"), checkpoint_module(checkpointed.to("xla"))
    x = torch.randn(4, 8)
    results = []
    for model in (plain, checkpointed):
        xin = x.to("xla").requires_grad_()
        with torch_xla.amp.autocast(torch_xla.device(), dtype=torch.bfloat16):
            out = model(xin)
        # Backward runs outside the autocast region: the recomputation must re-enter it, or
        # the gradients would come from a float32 forward.
        out.float().sum().backward()
        results.append((out.dtype, xin.grad.cpu(), model[0].weight.grad.cpu()))
    assert results[0][0] == results[1][0] == torch.bfloat16
    torch.testing.assert_close(results[1][1], results[0][1], rtol=0, atol=0)
    torch.testing.assert_close(results[1][2], results[0][2], rtol=0, atol=0)
