"""The PJRT device type: choosing the CPU client, and when the choice is fixed.

Checked on real torch_xla 2.9 (PJRT_DEVICE=CPU): ``set_device_type`` writes ``PJRT_DEVICE``
and refuses a different type only once the runtime is initialized (the first use of a device);
``device_type()`` reads the variable on every call; the CPU client has ``CPU_NUM_DEVICES``
devices named ``CPU:i``. The simulator starts as a TPU host and gives a program that asks for
CPU before the runtime starts the same CPU client.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch


@pytest.fixture(autouse=True)
def _pjrt_device_restored(monkeypatch):
    """``set_device_type`` writes ``PJRT_DEVICE`` into this process's environment, as torch_xla
    does, and a test's own ``monkeypatch.setenv`` of it then records that value to put back.
    The variable's state before the test is recorded first here, so monkeypatch's undo (last
    to first) ends with it; otherwise every later subprocess of this pytest worker (an
    ``xlasim run`` host, a docs example) would start on the CPU client with one device."""
    if "PJRT_DEVICE" in os.environ:
        monkeypatch.setenv("PJRT_DEVICE", os.environ["PJRT_DEVICE"])
    else:
        # monkeypatch records an absent variable only when it sets it: set, then remove.
        monkeypatch.setenv("PJRT_DEVICE", "")
        monkeypatch.delenv("PJRT_DEVICE")


def test_cpu_client_when_chosen_before_first_use(xla_target, monkeypatch):
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    assert not torch_xla._XLAC._xla_runtime_is_initialized()
    xr.set_device_type("CPU")
    monkeypatch.setenv("CPU_NUM_DEVICES", "2")
    assert os.environ["PJRT_DEVICE"] == "CPU"
    assert xr.device_type() == "CPU"
    assert not torch_xla._XLAC._xla_runtime_is_initialized()

    assert torch_xla.real_devices() == ["CPU:0", "CPU:1"]
    assert torch_xla._XLAC._xla_runtime_is_initialized()
    assert torch_xla.devices() == [torch.device("xla:0"), torch.device("xla:1")]
    assert torch_xla.device_count() == 2
    assert xr.global_runtime_device_count() == 2
    assert xr.global_runtime_device_attributes() == [{"name": "CPU:0"}, {"name": "CPU:1"}]
    assert (xr.process_count(), xr.process_index(), xr.host_index()) == (1, 0, 0)
    assert xm.xla_device_hw("xla:1") == "CPU"
    assert xm.xla_device_kind() == "cpu"
    t = torch.arange(3.0, device="xla:1") * 2
    assert t.device == torch.device("xla:1") and t.cpu().tolist() == [0.0, 2.0, 4.0]
    with pytest.raises(IndexError):
        torch_xla.device(3)


def test_cpu_num_devices_defaults_to_one(xla_target, monkeypatch):
    import torch_xla
    import torch_xla.runtime as xr

    monkeypatch.delenv("CPU_NUM_DEVICES", raising=False)
    xr.set_device_type("CPU")
    assert torch_xla.real_devices() == ["CPU:0"]
    assert xr.addressable_runtime_device_count() == 1


def test_device_type_fixed_once_the_runtime_starts(xla_target, monkeypatch):
    import torch_xla
    import torch_xla.runtime as xr

    xr.set_device_type("CPU")
    monkeypatch.setenv("CPU_NUM_DEVICES", "2")
    torch.ones(2, device=torch_xla.device())
    assert torch_xla._XLAC._xla_runtime_is_initialized()
    xr.set_device_type("CPU")  # the same type is accepted
    with pytest.raises(
        RuntimeError, match=r"^Can't change device type after XLA runtime is initialized$"
    ):
        xr.set_device_type("TPU")
    assert os.environ["PJRT_DEVICE"] == "CPU"
    # device_type() follows the variable, even where the runtime no longer does.
    monkeypatch.setenv("PJRT_DEVICE", "TPU_LEGACY")
    assert xr.device_type() == "TPU"
    monkeypatch.delenv("PJRT_DEVICE")
    assert xr.device_type() is None
    assert torch_xla.real_devices() == ["CPU:0", "CPU:1"]


def test_cpu_client_has_no_memory_stats_or_master_ip(xla_target, monkeypatch):
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    xr.set_device_type("CPU")
    monkeypatch.setenv("CPU_NUM_DEVICES", "2")
    with pytest.raises(RuntimeError, match="GetAllocatorStats is not supported"):
        xm.get_memory_info(torch_xla.device())
    with pytest.raises(RuntimeError, match=r"^IP discovery not supported for device: CPU$"):
        xr.get_master_ip()


def test_spmd_over_cpu_devices(xla_target, monkeypatch):
    import torch_xla
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    xr.set_device_type("CPU")
    monkeypatch.setenv("CPU_NUM_DEVICES", "2")
    xr.use_spmd()
    assert torch_xla.real_devices() == ["CPU:0", "CPU:1"]
    assert xr.addressable_device_count() == 1
    assert torch_xla._XLAC._xla_get_all_devices() == ["CPU:0"]
    mesh = xs.Mesh(np.arange(2), (2, 1), ("data", "model"))
    t = torch.arange(8.0).reshape(4, 2).to("xla")
    xs.mark_sharding(t, mesh, ("data", None))
    assert torch_xla._XLAC._get_xla_sharding_spec(t) == "{devices=[2,1]0,1}"
    shards = t.global_tensor if hasattr(t, "global_tensor") else t
    local = torch_xla._XLAC._get_local_shards([shards])[0]
    assert [device for _, device in local] == ["CPU:0", "CPU:1"]
    assert [s.tolist() for s, _ in local] == [[[0.0, 1.0], [2.0, 3.0]], [[4.0, 5.0], [6.0, 7.0]]]
    assert (t * 2).cpu().sum().item() == 56.0
