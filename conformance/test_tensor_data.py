"""``tensor.data = other`` on ``xla`` tensors: the tensor takes ``other``'s value, dtype and
shape, and the two share that value afterwards (an in-place op on either shows in both), as
real torch_xla 2.9 does (measured with ``PJRT_DEVICE=CPU``). ``Module.to(dtype)`` converts
parameters this way, so a bfloat16 module computes in bfloat16 (upstream's
test_data_type.py ``test_module_to_dtype``)."""

from __future__ import annotations

import pytest
import torch


def test_set_data_takes_the_new_value_and_shares_it(xla_target):
    import torch_xla

    dev = torch_xla.device()
    a = torch.zeros(3, device=dev)
    b = torch.ones(3, device=dev)
    a.data = b
    b.add_(1)
    assert a.cpu().tolist() == b.cpu().tolist() == [2.0, 2.0, 2.0]
    a.mul_(5)
    assert a.cpu().tolist() == b.cpu().tolist() == [10.0, 10.0, 10.0]
    torch_xla.sync()

    c = torch.zeros(2, 2, device=dev, requires_grad=True)
    c.data = torch.full((3,), 7.0, device=dev, dtype=torch.bfloat16)
    assert (c.shape, c.dtype, c.requires_grad) == (torch.Size([3]), torch.bfloat16, True)
    assert c.t().dtype == torch.bfloat16 and c.cpu().tolist() == [7.0, 7.0, 7.0]
    with pytest.raises(RuntimeError, match="have incompatible tensor type"):
        a.data = torch.zeros(3)


def test_module_to_bfloat16_computes_in_bfloat16(xla_target):
    import torch_xla

    dev = torch_xla.device()
    torch.manual_seed(0)
    linear = torch.nn.Linear(5, 10).to(dev).to(torch.bfloat16)
    x = torch.randn(10, 5).to(dev).to(torch.bfloat16)
    out = linear(x)
    assert out.dtype == torch.bfloat16
    expected = torch.nn.functional.linear(x.cpu(), linear.weight.cpu(), linear.bias.cpu())
    # bfloat16 products accumulate in a different order than eager CPU's: close, not equal
    torch.testing.assert_close(out.cpu(), expected, rtol=0.1, atol=0.01)


def test_module_to_dtype_converts_an_embeddings_device_weight(xla_target):
    import torch_xla

    dev = torch_xla.device()
    emb = torch.nn.Embedding(16, 4, device=dev).to(torch.bfloat16)
    out = emb(torch.ones(2, dtype=torch.long, device=dev))
    assert out.dtype == torch.bfloat16
    assert out.cpu().tolist() == emb.weight[1].cpu().expand(2, 4).tolist()
