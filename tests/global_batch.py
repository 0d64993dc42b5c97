"""The eager CPU reference for the multi-host training tests: a Linear(8, 1) trained with SGD for
two steps on the global batch the hosts feed (4 rows per device, seed 0)."""

from __future__ import annotations

import torch


def eager_sgd(num_devices: int, rows: slice = slice(None)) -> tuple[list[float], list[float]]:
    """(losses, final weight) of two SGD steps on ``rows`` of the global batch."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4 * num_devices, 8, generator=g)
    y = torch.randn(4 * num_devices, 1, generator=g)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(2):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[rows]), y[rows])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model.weight.detach().flatten().tolist()
