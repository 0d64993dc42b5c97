"""``t.data = other`` on device tensors (how ``nn.Module.to(dtype)`` converts parameters in
place): the tensor then holds ``other``'s value, dtype and shape, as with real torch_xla 2.9
on CPU."""

from __future__ import annotations

import torch


def test_data_assignment_takes_the_new_value(xla_target):
    import torch_xla

    dev = torch_xla.device()
    t = torch.zeros(3, device=dev)
    t.data = torch.arange(4.0, device=dev)
    assert t.shape == (4,) and t.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    assert (t + 1).cpu().tolist() == [1.0, 2.0, 3.0, 4.0]


def test_module_to_dtype_converts_device_parameters(xla_target):
    import torch_xla

    dev = torch_xla.device()
    emb = torch.nn.Embedding(16, 4, device=dev).to(torch.bfloat16)
    out = emb(torch.ones(2, dtype=torch.long, device=dev))
    assert out.dtype == torch.bfloat16
    assert out.cpu().tolist() == emb.weight[1].cpu().expand(2, 4).tolist()
