"""xm.set_replication and what follows from it in one process, as real torch_xla 2.9 behaves.

Client libraries (accelerate) call ``xm.set_replication(device, xm.get_xla_supported_devices())``
once per process; the world size then counts every device of that kind, unless something asked
for it before (torch_xla keeps its first answer).
"""

from __future__ import annotations

import time

import pytest
import torch


def test_set_replication_sets_world_size(xla_target):
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    dev = torch_xla.device()
    local = xm.get_xla_supported_devices()
    replicas = xm.xla_replication_devices(local)
    assert replicas == sorted(replicas, key=lambda d: int(d.split(":")[1]))
    assert len(replicas) == xr.global_device_count()
    assert {d.split(":")[0] for d in replicas} == {xla_target.device_type}
    xm.set_replication(dev, local)
    assert torch_xla._XLAC._xla_get_replication_devices_count() == xr.global_device_count()
    assert xr.world_size() == xr.global_device_count()
    xm.set_replication(dev, [])  # the first answer stays
    assert torch_xla._XLAC._xla_get_replication_devices_count() == 0
    assert xr.world_size() == xr.global_device_count()


def test_world_size_keeps_its_first_answer(xla_target):
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    assert xr.world_size() == 1
    xm.set_replication(torch_xla.device(), xm.get_xla_supported_devices())
    assert xr.world_size() == 1
    t = torch.arange(4.0, device=torch_xla.device())
    assert xm.all_reduce(xm.REDUCE_SUM, t).cpu().tolist() == [0.0, 1.0, 2.0, 3.0]


def test_replication_errors(xla_target):
    import torch_xla.core.xla_model as xm

    with pytest.raises(RuntimeError, match=r"Cannot replicate if number of devices \(1\) is"):
        xm.xla_replication_devices(["xla:0"])


def test_rate_tracker(xla_target):
    import torch_xla.core.xla_model as xm

    tracker = xm.RateTracker()
    tracker.add(10)
    time.sleep(0.01)  # so both rates divide 10 items by at least 10 ms
    assert 0 < tracker.rate() <= 1000
    assert 0 < tracker.global_rate() <= 1000
    tracker.add(5)
    assert tracker.global_rate() <= 1500
