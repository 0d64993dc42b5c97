"""torch_xla.core.functions (collectives with gradients) in one process, as real torch_xla 2.9."""

from __future__ import annotations

import torch


def test_all_reduce_gradient_is_scaled(xla_target):
    import torch_xla
    import torch_xla.core.functions as xf
    import torch_xla.core.xla_model as xm

    x = torch.tensor([1.0, -2.0, 3.0], device=torch_xla.device(), requires_grad=True)
    y = xf.all_reduce(xm.REDUCE_SUM, x, scale=2.0)
    (y * torch.arange(3.0, device=x.device)).sum().backward()
    assert y.cpu().tolist() == [1.0, -2.0, 3.0]  # one replica: a copy, scale unused
    assert x.grad.cpu().tolist() == [0.0, 2.0, 4.0]
    g = xf.all_gather(x, dim=0)
    g.sum().backward()
    assert x.grad.cpu().tolist() == [1.0, 3.0, 5.0]


def test_sync_batch_norm_matches_batch_norm_in_one_replica(xla_target):
    import torch_xla
    import torch_xla.core.functions as xf

    dev = torch_xla.device()
    gen = torch.Generator().manual_seed(0)
    batch = torch.randn(4, 3, 5, generator=gen)
    bn = xf.SyncBatchNorm(3).to(dev)
    assert repr(bn) == "SyncBatchNorm(3, eps=1e-05)"
    out = bn(batch.to(dev)).cpu()
    expected = torch.nn.functional.batch_norm(batch, None, None, training=True, eps=1e-5)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    biased = batch.var(dim=(0, 2), unbiased=False)
    torch.testing.assert_close(bn.running_var.cpu(), 0.9 + 0.1 * biased)
    torch.testing.assert_close(bn.running_mean.cpu(), 0.1 * batch.mean(dim=(0, 2)))
    bn.eval()
    flat = torch.randn(6, 3, generator=gen)
    ref = (flat - bn.running_mean.cpu()) / torch.sqrt(bn.running_var.cpu() + 1e-5)
    torch.testing.assert_close(bn(flat.to(dev)).cpu(), ref)


def test_distributed_mm_in_one_replica(xla_target):
    import torch_xla
    import torch_xla.core.functions as xf

    dev = torch_xla.device()
    w, x = torch.randn(3, 4), torch.randn(4, 6)
    torch.testing.assert_close(xf.distributed_mm(w.to(dev), x.to(dev)).cpu(), w @ x)
    torch.testing.assert_close(xf.distributed_mm(w.to(dev), x.to(dev), split=3).cpu(), w @ x)
