"""A small MLP trained on the device gives the same losses as eager CPU torch.

Measured on real torch_xla 2.9 CPU vs eager CPU torch 2.9 (20 steps, the model below): the
per-step losses differ by at most 1.2e-7 absolute / 1.9e-7 relative (SGD with momentum) and
1.2e-7 / 1.5e-7 (Adam), so they are compared with rtol=1e-5, atol=1e-6.
"""

from __future__ import annotations

import copy

import torch

STEPS = 20
LOSS_TOL = {"rtol": 1e-5, "atol": 1e-6}


def _model() -> torch.nn.Module:
    torch.manual_seed(1)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32),
        torch.nn.Tanh(),
        torch.nn.Linear(32, 32),
        torch.nn.ReLU(),
        torch.nn.Linear(32, 1),
    )


def _train(model, device, make_optimizer, sync) -> torch.Tensor:
    model = copy.deepcopy(model).to(device)
    opt = make_optimizer(model.parameters())
    g = torch.Generator().manual_seed(2)
    teacher = torch.randn(16, 1, generator=g)
    losses = []
    for _ in range(STEPS):
        x_cpu = torch.randn(8, 16, generator=g)
        x, y = x_cpu.to(device), torch.sin(x_cpu @ teacher).to(device)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        sync()
        losses.append(loss.detach())
    return torch.stack([loss.cpu() for loss in losses])


def test_mlp_losses_match_eager_cpu(xla_target):
    import torch_xla

    dev = torch_xla.device()
    model = _model()
    optimizers = {
        "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
        "adam": lambda p: torch.optim.Adam(p, lr=0.01),
    }
    for name, make in optimizers.items():
        cpu_losses = _train(model, torch.device("cpu"), make, lambda: None)
        xla_losses = _train(model, dev, make, torch_xla.sync)
        assert xla_losses.shape == (STEPS,)
        torch.testing.assert_close(xla_losses, cpu_losses, **LOSS_TOL, msg=name)
        # the model learns something, so the comparison is not between two constants
        assert xla_losses[-5:].mean() < xla_losses[:5].mean(), name


def test_nll_loss_takes_a_float_class_target(xla_target):
    """On the device a floating-point target of class indices is accepted (eager CPU refuses
    it); a non-integral value picks no class, so its sample weighs nothing, loss and grad."""
    import torch.nn.functional as F
    import torch_xla

    dev = torch_xla.device()
    torch.manual_seed(0)
    scores = torch.randn(6, 3)
    target = torch.tensor([0.5, 2.0, 1.0, 1.0, 0.0, 2.0])
    # The same sample weights in eager CPU terms: class indices, sample 0 ignored.
    as_indices = torch.tensor([-100, 2, 1, 1, 0, 2])
    for reduction in ("mean", "sum", "none"):
        x = scores.to(dev).requires_grad_(True)
        loss = F.nll_loss(x, target.to(dev), reduction=reduction)
        loss.sum().backward()
        expected_x = scores.clone().requires_grad_(True)
        expected = F.nll_loss(expected_x, as_indices, reduction=reduction)
        expected.sum().backward()
        torch.testing.assert_close(loss.cpu(), expected.detach(), **LOSS_TOL)
        torch.testing.assert_close(x.grad.cpu(), expected_x.grad, **LOSS_TOL)
    loss = torch.nn.CrossEntropyLoss()(torch.randn(8, 1).to(dev), torch.zeros(8).to(dev))
    assert loss.item() == 0.0
