"""The simulated TPU VM: chips on PCI, the metadata server, the default PJRT device.

What real torch_xla reads from the machine itself cannot be compared on a CPU host (it has no
TPU chips and no metadata server), so the expected values here come from the slice model:
a v4-16 host has 4 chips, its ``tpu-env`` names the slice and the host's worker id.
"""

from __future__ import annotations

import importlib

import pytest
import torch

import xlasim


@pytest.fixture
def no_tpu_vars(monkeypatch):
    for name in (
        "TPU_SKIP_MDS_QUERY",
        "TPU_ACCELERATOR_TYPE",
        "TPU_WORKER_ID",
        "TPU_WORKER_HOSTNAMES",
        "TPU_HOST_BOUNDS",
        "TPU_CHIPS_PER_HOST_BOUNDS",
        "TPU_PROCESS_BOUNDS",
        "TPU_CHIPS_PER_PROCESS_BOUNDS",
        "CLOUD_TPU_TASK_ID",
    ):
        monkeypatch.delenv(name, raising=False)


def test_metadata_of_a_multi_host_slice(no_tpu_vars):
    with xlasim.simulate("2x2x2", "v4", host_index=1):
        import torch_xla.runtime as xr
        from torch_xla._internal import tpu

        assert tpu.get_tpu_env() == {
            "ACCELERATOR_TYPE": "v4-16",
            "TPU_PROCESS_BOUNDS": "1,1,2",
            "TPU_CHIPS_PER_PROCESS_BOUNDS": "2,2,1",
            "WORKER_ID": "1",
        }
        assert (tpu.version(), tpu.get_tpu_type(), tpu.worker_id()) == (4, "v4", 1)
        assert tpu.get_worker_ips() == ["localhost", "localhost"]
        assert tpu.num_available_chips() == 4
        assert tpu.num_available_devices() == 4
        assert tpu.num_expected_global_devices() == 8
        assert tpu.num_local_processes() == 4
        assert xr.host_index() == 1


def test_the_metadata_server_serves_the_attributes_torch_xla_parses(no_tpu_vars):
    # The formats are the GCE metadata server's, as torch_xla 2.9 parses them (its
    # _get_metadata callers; upstream's pjrt/test_internal_tpu.py feeds it the same shapes):
    # ``tpu-env`` a YAML mapping of quoted strings, workers ``hostname:id:address``.
    with xlasim.simulate("2x2x2", "v4", host_index=1):
        from torch_xla._internal import tpu

        env = tpu._get_metadata("tpu-env")
        assert "ACCELERATOR_TYPE: 'v4-16'\n" in env and "WORKER_ID: '1'\n" in env
        workers = tpu._get_metadata("worker-network-endpoints").split(",")
        assert [w.split(":")[2] for w in workers] == ["localhost", "localhost"]
        with pytest.raises(NotImplementedError, match="metadata attribute 'zone'"):
            tpu._get_metadata("zone")


def test_logical_cores_follow_torch_xla_version_rule(no_tpu_vars):
    with xlasim.simulate("2x2", "v3"):
        from torch_xla._internal import tpu

        assert tpu.get_tpu_env()["ACCELERATOR_TYPE"] == "v3-8"
        assert tpu.num_logical_cores_per_chip() == 2
        assert tpu.num_available_devices() == 8


def test_master_ip_of_a_one_host_slice(no_tpu_vars):
    with xlasim.simulate("2x2x1", "v4"):
        import torch_xla.runtime as xr

        assert xr.get_master_ip() == "localhost"


def test_default_device_selection_at_import(monkeypatch):
    with xlasim.simulate("2x2x1", "v4"):
        import torch_xla
        import torch_xla.runtime as xr

        monkeypatch.delenv("PJRT_DEVICE")
        monkeypatch.setenv("PJRT_SELECT_DEFAULT_DEVICE", "0")
        importlib.reload(torch_xla)
        assert xr.device_type() is None
        monkeypatch.delenv("PJRT_SELECT_DEFAULT_DEVICE")
        importlib.reload(torch_xla)
        assert xr.device_type() == "TPU"  # the simulated host has TPU chips


def test_runtime_without_a_device_type(monkeypatch):
    with xlasim.simulate("2x2x1", "v4"):
        import torch_xla

        monkeypatch.delenv("PJRT_DEVICE")
        with pytest.raises(RuntimeError, match=r"^\$PJRT_DEVICE is not set\.$"):
            torch_xla.device()


@pytest.mark.parametrize(
    ("device", "error"),
    [("CUDA", NotImplementedError), ("NEURON", NotImplementedError), ("TOASTER", RuntimeError)],
)
def test_unsimulated_device_types(monkeypatch, device, error):
    with xlasim.simulate("2x2x1", "v4"):
        import torch_xla
        import torch_xla.runtime as xr

        xr.set_device_type(device)
        with pytest.raises(error, match=device):
            torch_xla.real_devices()


def test_cpu_client_inside_a_multi_host_slice(monkeypatch):
    """Each host process that picks CPU gets its own one-process CPU client."""
    monkeypatch.setenv("CPU_NUM_DEVICES", "3")
    with xlasim.simulate("2x2x2", "v4", host_index=1):
        import torch
        import torch_xla
        import torch_xla.runtime as xr

        xr.set_device_type("CPU")
        assert torch_xla.real_devices() == ["CPU:0", "CPU:1", "CPU:2"]
        assert (xr.process_count(), xr.process_index(), xr.host_index()) == (1, 0, 0)
        with pytest.raises(RuntimeError, match="no per-chip HBM"):
            xlasim.chip_memory()
        assert (torch.ones(2, device="xla:2") + 1).cpu().tolist() == [2.0, 2.0]


def test_a_client_that_failed_to_start_fails_the_same_way_after(monkeypatch):
    # Real torch_xla 2.9 on CPU (its upstream test_runtime_client_initialization_error): the
    # failure is kept, so a valid PJRT_DEVICE set afterwards changes nothing.
    with xlasim.simulate("2x2x1", "v4"):
        import torch_xla

        monkeypatch.setenv("PJRT_DEVICE", "DUMMY_DEVICE")
        message = r"^No PjRtPlugin registered for: DUMMY_DEVICE\. Make sure the environment"
        with pytest.raises(RuntimeError, match=message):
            torch_xla._XLAC._init_computation_client()
        monkeypatch.setenv("PJRT_DEVICE", "CPU")
        for start in (
            torch_xla._XLAC._init_computation_client,
            lambda: torch.ones(1, device="xla"),
        ):
            with pytest.raises(RuntimeError, match=message):
                start()
        assert not torch_xla._XLAC._xla_runtime_is_initialized()
