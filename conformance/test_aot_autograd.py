"""AOTAutograd (``functorch.compile.aot_function``) on xla tensors: the captured forward and
backward run on the device and give eager CPU torch's values, as with real torch_xla 2.9."""

from __future__ import annotations

import torch


def test_aot_function_forward_and_backward(xla_target):
    import torch_xla
    from functorch.compile import aot_function, make_boxed_func

    def fn(x):
        return torch.sin(x) * 3 + 42

    graphs = []

    def keep(gm, _inputs):
        graphs.append(gm)
        return make_boxed_func(gm)

    values = torch.linspace(-2.0, 2.0, 8)
    # No CPU backward runs first: real torch 2.9's autograd engine sizes its per-device
    # queues at its first backward, and an xla backward after a CPU-only one trips on that.
    x = values.to(torch_xla.device()).requires_grad_(True)
    y = aot_function(fn, keep)(x)
    assert y.device.type == "xla"
    # The tangent of y.sum() is a device tensor: AOTAutograd takes it as a plain tensor.
    y.sum().backward()
    torch_xla.sync()
    assert len(graphs) == 2  # forward and backward
    assert torch.allclose(y.cpu(), fn(values))
    assert torch.allclose(x.grad.cpu(), 3 * torch.cos(values))
