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


def test_scan_traces_a_pure_fn_once(xla_target):
    # real torch_xla 2.9 on CPU (upstream's scan/test_scan.py passes there): fn is traced by
    # AOTAutograd, which calls it twice, and a pure fn's graphs are reused; others are not kept
    import torch_xla
    import torch_xla.experimental.scan as scan_module

    calls = 0

    def step(carry, x):
        nonlocal calls
        calls += 1
        return carry + x, x * 2

    dev = torch_xla.device()
    init = torch.zeros(2, device=dev)
    xs = torch.arange(6.0).reshape(3, 2).to(dev).requires_grad_()
    scan_module._SCAN_COMPUTATION_CACHE.clear()
    for _ in range(4):
        final, ys = scan_module.scan(step, init, xs, is_fn_pure=True)
    assert calls == 2
    assert final.cpu().tolist() == [6.0, 9.0]
    assert ys.cpu().tolist() == [[0.0, 2.0], [4.0, 6.0], [8.0, 10.0]]
    assert step in scan_module._SCAN_COMPUTATION_CACHE

    def impure(carry, x):
        return carry + x, x

    scan_module.scan(impure, init, xs)
    assert impure not in scan_module._SCAN_COMPUTATION_CACHE


def test_value_and_grad_partitioned_step_functions(xla_target):
    # torch_xla 2.9's contract (its docstring, checked on real torch_xla 2.9 on CPU):
    # forward -> (new_carry, (y, partial activations)); alias_input puts back the activations
    # that are inputs of x; backward(grad_new_carry, (grad_y, activations)) -> (grad_carry,
    # grad_x). For carry @ x the saved activations are (carry, x).
    import torch_xla
    from torch_xla.experimental.scan import value_and_grad_partitioned

    dev = torch_xla.device()
    c0 = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    x0 = torch.tensor([[1.0, 0.5], [0.0, 2.0]])
    init = c0.to(dev).requires_grad_()
    xs = x0.unsqueeze(0).to(dev).requires_grad_()
    forward, alias_input, backward = value_and_grad_partitioned(
        lambda c, x: (c @ x, c @ x), init, xs
    )
    new_carry, (y, partial) = forward(init, xs[0])
    activations = alias_input(partial, xs[0])
    assert len(activations) == 2
    torch.testing.assert_close(new_carry.cpu(), c0 @ x0)
    torch.testing.assert_close(activations[0].cpu(), c0)
    torch.testing.assert_close(activations[1].cpu(), x0)
    ones = torch.ones(2, 2)
    grad_c, grad_x = backward(ones.to(dev), (ones.to(dev), activations))
    torch.testing.assert_close(grad_c.cpu(), (2 * ones) @ x0.T)
    torch.testing.assert_close(grad_x.cpu(), c0.T @ (2 * ones))


def test_scan_saves_xs_itself_for_backward(xla_target):
    # real torch_xla 2.9 on CPU: an activation that is a slice of xs is saved as xs itself
    # (the same tensor object), not a stacked copy; and AOTAutograd refuses a fn that mutates
    # a tensor it captured, naming FakeTensor
    import torch_xla
    from torch_xla.experimental.scan import scan

    dev = torch_xla.device()
    xs = torch.randn(5, 3, device=dev, requires_grad=True)
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        _, ys = scan(lambda c, x: (c, torch.sin(x)), torch.zeros(3, device=dev), xs)
    assert [t for t in saved if t.shape == xs.shape] and all(
        t is xs for t in saved if t.shape == xs.shape
    )
    ys.sum().backward()
    torch.testing.assert_close(xs.grad.cpu(), torch.cos(xs.detach().cpu()))

    captured = torch.zeros(3, device=dev)

    def mutates_captured(c, x):
        captured.add_(1.0)
        return c + x, c

    with pytest.raises(AssertionError, match="FakeTensor"):
        scan(mutates_captured, torch.zeros(3, device=dev), xs.detach())
