"""torch_xla's ``xla::max_pool2d_forward`` / ``xla::max_pool2d_backward`` ops (schemas as torch_xla
2.9's C++ extension registers them; torchax lowers the ``xla::`` ops it finds by these)."""

from __future__ import annotations

import torch


def test_max_pool_ops_compute_torch_max_pooling(xlasim_sim):
    import torch_xla  # noqa: F401 - defines the xla:: ops in the simulation

    torch.manual_seed(0)
    x = torch.randn(2, 3, 7, 7)
    ref_in = x.clone().requires_grad_()
    ref = torch.nn.functional.max_pool2d(ref_in, 3, stride=2, padding=1, ceil_mode=True)
    ref.backward(torch.arange(float(ref.numel())).reshape(ref.shape))

    dev = x.to("xla")
    out = torch.ops.xla.max_pool2d_forward(dev, [3, 3], [2, 2], [1, 1], [1, 1], True)
    assert torch.equal(out.cpu(), ref.detach())
    grad = torch.arange(float(ref.numel())).reshape(ref.shape).to("xla")
    back = torch.ops.xla.max_pool2d_backward(grad, dev, [3, 3], [2, 2], [1, 1], True)
    assert torch.equal(back.cpu(), ref_in.grad)
    # The schema's defaults: stride [] is the kernel size, no padding.
    assert torch.equal(
        torch.ops.xla.max_pool2d_forward(dev, [2, 2]).cpu(), torch.nn.functional.max_pool2d(x, 2)
    )
