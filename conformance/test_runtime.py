"""torch_xla.runtime queries in plain and SPMD mode, and the top-level device helpers.

Expected values come from the slice the target runs (``xla_target``), using the rules read from
torch_xla 2.9's runtime.py and checked on real torch_xla (PJRT_DEVICE=CPU CPU_NUM_DEVICES=4):
this process is host ``xla_target.host_index`` and sees that host's devices.
"""

from __future__ import annotations

import warnings

import pytest
import torch


def _local_devices(xla_target) -> list[torch.device]:
    return [torch.device("xla", i) for i in range(xla_target.devices_per_host)]


def test_version(xla_target):
    import torch_xla

    assert torch_xla.__version__ == "2.9.0"


def test_runtime_queries_plain(xla_target):
    import torch_xla
    import torch_xla.runtime as xr

    n_local, n_global = xla_target.devices_per_host, xla_target.num_devices
    assert not xr.is_spmd()
    assert xr.device_type() == xla_target.device_type
    assert xr.global_runtime_device_count() == n_global
    assert xr.addressable_runtime_device_count() == n_local
    assert xr.addressable_device_count() == n_local
    assert xr.global_device_count() == n_global
    assert xr.local_device_count() == n_local
    # world_size is 1 outside xmp.spawn: no replication devices are set.
    assert xr.world_size() == 1
    assert xr.process_count() == xla_target.num_hosts
    assert xr.process_index() == xla_target.host_index
    assert xr.host_index() == xla_target.host_index
    assert xr.global_ordinal() == 0
    assert xr.local_ordinal() == 0
    assert torch_xla.devices() == _local_devices(xla_target)
    assert torch_xla.device() == torch.device("xla:0")
    assert torch_xla.device_count() == n_local
    assert torch_xla.real_devices() == [f"{xla_target.device_type}:{i}" for i in range(n_local)]
    # int results, not numpy or tensor scalars
    for value in (xr.global_runtime_device_count(), xr.addressable_device_count(), xr.world_size()):
        assert type(value) is int


def test_device_index_becomes_the_default_device(xla_target):
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    if xla_target.devices_per_host < 2:
        pytest.skip("needs two devices on this host")
    # torch_xla.device(n) sets the default device (`_xla_set_default_device`), so later
    # device() calls, local_ordinal() and is_master_ordinal() follow it.
    assert torch_xla.device(1) == torch.device("xla:1")
    assert torch_xla.device() == torch.device("xla:1")
    assert xr.local_ordinal() == 1
    assert not xm.is_master_ordinal()
    assert torch.ones(2, device=torch_xla.device()).device == torch.device("xla:1")
    assert torch_xla.device(0) == torch.device("xla:0")
    assert xm.is_master_ordinal()


def test_runtime_queries_spmd(xla_target):
    import os

    import torch_xla
    import torch_xla.runtime as xr

    n_local, n_global = xla_target.devices_per_host, xla_target.num_devices
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # before any tensor exists use_spmd() warns nothing
        xr.use_spmd()
    assert xr.is_spmd()
    assert os.environ["XLA_USE_SPMD"] == "1"
    assert xr.device_type() == xla_target.device_type
    assert xr.global_runtime_device_count() == n_global
    assert xr.addressable_runtime_device_count() == n_local
    # Under SPMD the process sees one virtual device.
    assert xr.addressable_device_count() == 1
    assert xr.global_device_count() == 1
    assert xr.local_device_count() == 1
    assert xr.world_size() == 1
    assert xr.process_count() == xla_target.num_hosts
    assert xr.process_index() == xla_target.host_index
    assert xr.global_ordinal() == 0
    assert xr.local_ordinal() == 0
    assert torch_xla.devices() == [torch.device("xla:0")]
    assert torch_xla.device() == torch.device("xla:0")
    assert torch_xla.device(n_local - 1) == torch.device("xla:0")
    assert torch_xla.device_count() == n_local
    assert torch_xla.real_devices() == [f"{xla_target.device_type}:{i}" for i in range(n_local)]
    t = torch.arange(4.0, device=torch_xla.device()) * 2
    assert t.device == torch.device("xla:0")
    assert t.cpu().tolist() == [0.0, 2.0, 4.0, 6.0]


def test_use_spmd_after_tensors_warns(xla_target):
    import torch_xla
    import torch_xla.runtime as xr

    t = torch.ones(3, device=torch_xla.device()) + 1
    with pytest.warns(
        UserWarning,
        match=r"^Replicating tensors already initialized on "
        r"non-virtual XLA device for SPMD to force SPMD mode\.",
    ):
        xr.use_spmd()
    assert xr.is_spmd()
    assert xr.addressable_device_count() == 1
    assert t.cpu().tolist() == [2.0, 2.0, 2.0]


def test_get_master_ip(xla_target):
    import torch_xla.runtime as xr

    if xla_target.device_type == "CPU":
        with pytest.raises(RuntimeError, match=r"^IP discovery not supported for device: CPU$"):
            xr.get_master_ip()
    else:
        ip = xr.get_master_ip()
        assert isinstance(ip, str) and ip


def test_initialize_cache_only_before_computation(xla_target, tmp_path, monkeypatch):
    import os

    import torch_xla
    import torch_xla.runtime as xr

    monkeypatch.delenv("XLA_PERSISTENT_CACHE_PATH", raising=False)
    monkeypatch.delenv("XLA_PERSISTENT_CACHE_READ_ONLY", raising=False)
    cache = tmp_path / "cache"
    xr.initialize_cache(str(cache), readonly=True)
    assert os.environ["XLA_PERSISTENT_CACHE_PATH"] == str(cache)
    assert os.environ["XLA_PERSISTENT_CACHE_READ_ONLY"] == "1"
    xr.initialize_cache(str(cache))  # still allowed: nothing has been compiled yet
    assert os.environ["XLA_PERSISTENT_CACHE_READ_ONLY"] == "0"
    # Creating device tensors compiles nothing; the cache is created by the first execution.
    t = torch.ones(3, device=torch_xla.device()) * 3
    xr.initialize_cache(str(cache))
    torch_xla.sync()
    assert t.cpu().tolist() == [3.0, 3.0, 3.0]
    with pytest.raises(AssertionError, match=r"^Computation cache has already been initialized$"):
        xr.initialize_cache(str(cache))
