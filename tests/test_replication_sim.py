"""One process replicated over several devices on the simulator: a collective there would wait
for replicas that never start (torch_xla aborts after its rendezvous timeout), so the simulator
says so at once."""

from __future__ import annotations

import pytest
import torch


def test_collective_over_missing_replicas_raises(xlasim_sim):
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    dev = torch_xla.device()
    xm.set_replication(dev, xm.get_xla_supported_devices())
    assert xr.world_size() == xlasim_sim.num_devices
    with pytest.raises(RuntimeError, match=r"xm.all_reduce: xr.world_size\(\) is 4 .* only 1 "):
        xm.all_reduce(xm.REDUCE_SUM, torch.ones(2, device=dev))
