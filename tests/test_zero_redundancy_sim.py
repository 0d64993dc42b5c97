"""``torch_xla.distributed.zero_redundancy_optimizer`` loads on the simulator (upstream's ZeRO-1
test imports it at the top, then runs nothing on a CPU device); making the optimizer refuses."""

from __future__ import annotations

import pytest
import torch


def test_the_module_loads_and_the_optimizer_refuses(xlasim_sim):
    from torch_xla.distributed.zero_redundancy_optimizer import ZeroRedundancyOptimizer

    model = torch.nn.Linear(4, 4).to("xla")
    with pytest.raises(NotImplementedError, match="ZeroRedundancyOptimizer"):
        ZeroRedundancyOptimizer(model.parameters(), torch.optim.SGD, lr=0.1)
