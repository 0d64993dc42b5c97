"""Models and timing helpers the simulator benchmarks share.

Each benchmark measures the simulator side by side with eager CPU torch in one process and
prints ratios; absolute times on a shared 2-core machine mean little.  Times are the process's
CPU time (all its threads), which other processes' load does not inflate the way it does
wall-clock time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn


class ResidualMLP(nn.Module):
    """``depth`` blocks of ``x + relu(linear(x))``: every block is a skip connection, so a
    graph walk that revisits shared inputs doubles its work per block."""

    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + torch.relu(block(x))
        return self.head(x)


class Bottleneck(nn.Module):
    """ResNet's bottleneck block: 1x1 reduce, 3x3, 1x1 expand, batchnorm, residual add."""

    def __init__(self, cin: int, mid: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, mid, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(mid)
        self.conv2 = nn.Conv2d(mid, mid, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(mid)
        self.conv3 = nn.Conv2d(mid, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.down: nn.Module | None = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = torch.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        skip = x if self.down is None else self.down(x)
        return torch.relu(out + skip)


class ResNet50Shaped(nn.Module):
    """ResNet-50's layout (stem, 3-4-6-3 bottleneck stages, 4x expansion, pooled head) with
    the channel counts divided by ``shrink`` so a CPU step is quick at small images."""

    def __init__(self, shrink: int = 8, classes: int = 10) -> None:
        super().__init__()
        base = 64 // shrink
        self.stem = nn.Sequential(
            nn.Conv2d(3, base, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(base),
            nn.ReLU(),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
        blocks: list[nn.Module] = []
        cin = base
        for stage, count in enumerate((3, 4, 6, 3)):
            mid = base * 2**stage
            for i in range(count):
                stride = 2 if stage > 0 and i == 0 else 1
                blocks.append(Bottleneck(cin, mid, mid * 4, stride))
                cin = mid * 4
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def train_step(
    model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    opt.zero_grad()
    out = model(x)
    loss = (
        nn.functional.mse_loss(out, y)
        if out.shape == y.shape
        else nn.functional.cross_entropy(out, y)
    )
    loss.backward()
    opt.step()
    return loss


def timed(fn: Callable[[], Any]) -> float:
    """CPU seconds ``fn()`` took."""
    start = time.process_time()
    fn()
    return time.process_time() - start
