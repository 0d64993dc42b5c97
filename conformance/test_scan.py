"""``torch_xla.experimental.scan`` and ``scan_layers``: values and gradients as real torch_xla
2.9 computes them (equal to running the steps or layers one after another on the CPU), the
carry updated in place inside ``fn`` never reaching ``init`` or earlier outputs, and
torch_xla's errors for bad ``xs`` and mismatched layers."""

from __future__ import annotations

import pytest
import torch
from torch import nn


def test_scan_carries_and_stacks(xla_target):
    import torch_xla
    from torch_xla.experimental.scan import scan

    dev = torch_xla.device()

    def running_sum(total, x):
        total += x  # in place, as upstream's cumsum example does
        return total, total

    init = torch.zeros(2, device=dev)
    xs = torch.arange(6.0).reshape(3, 2).to(dev)
    final, history = scan(running_sum, init, xs)
    assert final.cpu().tolist() == [6.0, 9.0]
    assert history.cpu().tolist() == [[0.0, 1.0], [2.0, 4.0], [6.0, 9.0]]
    assert init.cpu().tolist() == [0.0, 0.0]

    def mean_so_far(carry, x):
        new = {"sum": carry["sum"] + x["v"], "n": carry["n"] + 1.0}
        return new, new["sum"] / new["n"]

    carry = {"sum": torch.zeros(1, device=dev), "n": torch.zeros(1, device=dev)}
    final, means = scan(mean_so_far, carry, {"v": torch.arange(1.0, 5.0).to(dev)})
    assert (final["sum"].cpu().tolist(), final["n"].cpu().tolist()) == ([10.0], [4.0])
    assert means.cpu().flatten().tolist() == [1.0, 1.5, 2.0, 2.5]


def test_scan_gradients_match_a_cpu_loop(xla_target):
    import torch_xla
    from torch_xla.experimental.scan import scan

    gen = torch.Generator().manual_seed(0)
    xs0, h0 = torch.randn(4, 3, generator=gen), torch.randn(3, generator=gen)

    def step(h, x):  # (torch_xla's tracing refuses a fn that captures tensors)
        h = torch.tanh(h * 0.5 + x)
        return h, h * h

    dev = torch_xla.device()
    xs = xs0.to(dev).requires_grad_()
    init = h0.to(dev).requires_grad_()
    final, ys = scan(step, init, xs)
    (final.sum() + ys.sum()).backward()

    xs_ref, h = xs0.clone().requires_grad_(), h0.clone().requires_grad_()
    h_ref, outs = h, []
    for i in range(4):
        h = torch.tanh(h * 0.5 + xs_ref[i])
        outs.append(h * h)
    (h.sum() + torch.stack(outs).sum()).backward()
    torch.testing.assert_close(final.cpu(), h.detach())
    torch.testing.assert_close(ys.cpu(), torch.stack(outs).detach())
    torch.testing.assert_close(xs.grad.cpu(), xs_ref.grad)
    torch.testing.assert_close(init.grad.cpu(), h_ref.grad)


def test_scan_bad_xs(xla_target):
    import torch_xla
    from torch_xla.experimental.scan import scan

    dev = torch_xla.device()
    with pytest.raises(ValueError, match="must have the same leading dimension size"):
        scan(
            lambda c, x: (c, x),
            torch.zeros(1, device=dev),
            [torch.zeros(2, device=dev), torch.zeros(3, device=dev)],
        )
    with pytest.raises(ValueError, match="is an empty PyTree"):
        scan(lambda c, x: (c, x), torch.zeros(1, device=dev), [])
    with pytest.raises(ValueError, match="must be callable"):
        scan(3, torch.zeros(1, device=dev), torch.zeros(2, device=dev))


def test_scan_layers_equals_running_the_layers(xla_target):
    import torch_xla
    from torch_xla.experimental.scan_layers import scan_layers

    torch.manual_seed(0)
    cpu_layers = [nn.Sequential(nn.Linear(4, 4), nn.GELU()) for _ in range(3)]
    x0 = torch.randn(2, 4)
    dev = torch_xla.device()
    layers = [nn.Sequential(nn.Linear(4, 4), nn.GELU()).to(dev) for _ in range(3)]
    for layer, ref in zip(layers, cpu_layers, strict=True):
        layer.load_state_dict(ref.state_dict())
    out = scan_layers(layers, x0.to(dev))
    out.sum().backward()
    expected = x0
    for ref in cpu_layers:
        expected = ref(expected)
    expected.sum().backward()
    torch.testing.assert_close(out.cpu(), expected.detach())
    for layer, ref in zip(layers, cpu_layers, strict=True):
        torch.testing.assert_close(layer[0].weight.grad.cpu(), ref[0].weight.grad)
    assert scan_layers([], x0) is x0

    with pytest.raises(ValueError, match=r"Shape mismatch for '0.weight' in layer 1"):
        scan_layers([nn.Sequential(nn.Linear(4, 4)), nn.Sequential(nn.Linear(3, 4))], x0)
    with pytest.raises(ValueError, match=r"Layer 1 has mismatched keys. Missing keys"):
        scan_layers([nn.Linear(4, 4), nn.Linear(4, 4, bias=False)], x0)
