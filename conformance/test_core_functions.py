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


def test_all_reduce_gradient_of_each_reduce_type(xla_target):
    import torch_xla
    import torch_xla.core.functions as xf
    import torch_xla.core.xla_model as xm

    dev = torch_xla.device()
    weights = torch.tensor([1.0, 2.0, 3.0], device=dev)
    grads = {}
    for kind in (xm.REDUCE_SUM, xm.REDUCE_MUL, xm.REDUCE_MIN, xm.REDUCE_MAX, xm.REDUCE_OR):
        x = torch.tensor([2.0, 0.0, -3.0], device=dev, requires_grad=True)
        y = xf.all_reduce(kind, x, scale=3.0)
        try:
            (y * weights).sum().backward()
        except RuntimeError as error:
            grads[kind] = str(error)
        else:
            grads[kind] = x.grad.cpu().tolist()
    # One replica: MUL's gradient is 0 where the input is 0; MIN and MAX pass it to every
    # element (each is the extremum of its own single value); OR has none.
    assert grads == {
        xm.REDUCE_SUM: [3.0, 6.0, 9.0],
        xm.REDUCE_MUL: [3.0, 0.0, 9.0],
        xm.REDUCE_MIN: [3.0, 6.0, 9.0],
        xm.REDUCE_MAX: [3.0, 6.0, 9.0],
        xm.REDUCE_OR: "Unsupported reduce type: or",
    }


def test_sync_batch_norm_starts_as_the_identity_with_standard_statistics(xla_target):
    import torch_xla.core.functions as xf

    bn = xf.SyncBatchNorm(4, eps=1e-3, momentum=0.2)
    assert (bn.num_features, bn.eps, bn.momentum) == (4, 1e-3, 0.2)
    state = {name: (value.dtype, value.tolist()) for name, value in bn.state_dict().items()}
    assert list(state) == ["weight", "bias", "running_mean", "running_var"]
    assert state["weight"] == state["running_var"] == (torch.float32, [1.0] * 4)
    assert state["bias"] == state["running_mean"] == (torch.float32, [0.0] * 4)
    assert [name for name, _ in bn.named_parameters()] == ["weight", "bias"]


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


def test_batch_norm_running_variance_follows_the_biased_batch_variance(xla_target):
    """torch_xla's BatchNorm moves running_var towards the batch's biased variance (PyTorch's
    CPU kernel: the unbiased one); the output, running_mean and the gradient are PyTorch's."""
    import torch_xla

    dev = torch_xla.device()
    gen = torch.Generator().manual_seed(0)
    batch = torch.randn(2, 3, generator=gen)  # two samples: the two variances differ by 2x
    images = torch.randn(4, 3, 5, 5, generator=gen)
    for layer, x in ((torch.nn.BatchNorm1d(3), batch), (torch.nn.BatchNorm2d(3), images)):
        on_cpu = torch.nn.BatchNorm1d(3) if x.dim() == 2 else torch.nn.BatchNorm2d(3)
        layer = layer.to(dev)
        xd = x.to(dev).requires_grad_()
        xc = x.clone().requires_grad_()
        layer(xd).square().sum().backward()
        on_cpu(xc).square().sum().backward()
        torch_xla.sync()
        dims = [d for d in range(x.dim()) if d != 1]
        torch.testing.assert_close(
            layer.running_var.cpu(), 0.9 + 0.1 * x.var(dim=dims, unbiased=False)
        )
        torch.testing.assert_close(on_cpu.running_var, 0.9 + 0.1 * x.var(dim=dims))
        torch.testing.assert_close(layer.running_mean.cpu(), on_cpu.running_mean)
        torch.testing.assert_close(xd.grad.cpu(), xc.grad, rtol=1e-4, atol=1e-4)
    layer.momentum = None  # a cumulative average: the first batch's statistics themselves
    layer.reset_running_stats()
    layer(images.to(dev))
    torch_xla.sync()
    expected = images.var(dim=(0, 2, 3), unbiased=False)
    torch.testing.assert_close(layer.running_var.cpu(), expected)


def test_distributed_mm_in_one_replica(xla_target):
    import torch_xla
    import torch_xla.core.functions as xf

    dev = torch_xla.device()
    w, x = torch.randn(3, 4), torch.randn(4, 6)
    torch.testing.assert_close(xf.distributed_mm(w.to(dev), x.to(dev)).cpu(), w @ x)
    torch.testing.assert_close(xf.distributed_mm(w.to(dev), x.to(dev), split=3).cpu(), w @ x)
