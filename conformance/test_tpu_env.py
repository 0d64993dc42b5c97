"""``torch_xla.core.xla_env_vars`` and the TPU environment ``torch_xla._internal.tpu`` reads.

With ``TPU_SKIP_MDS_QUERY`` set, torch_xla describes the TPU host from the ``TPU_*`` variables
alone, so every target gives the same answers for the same variables (checked on real
torch_xla 2.9 on CPU). What depends on the machine itself (TPU chips on PCI, the metadata
server) is tested on the simulator in ``tests/test_tpu_host.py``.
"""

from __future__ import annotations

import pytest

_V4_16_HOST_1 = {
    "TPU_SKIP_MDS_QUERY": "1",
    "TPU_ACCELERATOR_TYPE": "v4-16",
    "TPU_HOST_BOUNDS": "1,1,2",
    "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1",
    "TPU_WORKER_ID": "1",
    "TPU_WORKER_HOSTNAMES": "host-a,host-b",
}
_PROCESS_VARS = (
    "TPU_PROCESS_BOUNDS",
    "TPU_CHIPS_PER_PROCESS_BOUNDS",
    "CLOUD_TPU_TASK_ID",
    "TPU_PROCESS_ADDRESSES",
    "TPU_VISIBLE_CHIPS",
    "TPU_PROCESS_PORT",
)


@pytest.fixture
def v4_16_host_1(monkeypatch):
    for name in _PROCESS_VARS:
        # setenv first so that teardown also removes what the test's calls set: delenv of
        # an unset name records nothing to undo.
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    for name, value in _V4_16_HOST_1.items():
        monkeypatch.setenv(name, value)


def test_env_var_names(xla_target):
    import torch_xla.core.xla_env_vars as xenv

    names = {k: v for k, v in vars(xenv).items() if k.isupper()}
    renamed = {
        "TPU_MESH_CTLER_ADDR": "TPU_MESH_CONTROLLER_ADDRESS",
        "TPU_MESH_CTLER_PORT": "TPU_MESH_CONTROLLER_PORT",
    }
    assert {k: v for k, v in names.items() if k != v} == renamed
    for name in ("PJRT_DEVICE", "CPU_NUM_DEVICES", "TPU_SKIP_MDS_QUERY", "TPU_PROCESS_BOUNDS"):
        assert names[name] == name
    assert len(names) == 30


def test_tpu_env_from_variables(xla_target, v4_16_host_1):
    from torch_xla._internal import tpu

    assert tpu.get_tpu_env() == {
        "ACCELERATOR_TYPE": "v4-16",
        "TPU_PROCESS_BOUNDS": "1,1,2",
        "TPU_CHIPS_PER_PROCESS_BOUNDS": "2,2,1",
        "WORKER_ID": "1",
    }
    assert tpu.version() == 4
    assert tpu.get_tpu_type() == "v4"
    assert tpu.worker_id() == 1
    assert tpu.get_worker_ips() == ["host-a", "host-b"]
    assert tpu.num_tpu_workers() == 2
    assert tpu.num_logical_cores_per_chip() == 1
    assert tpu.process_bounds_size() is None
    assert tpu.task_id() is None


def test_tpu_env_variables_take_precedence(xla_target, v4_16_host_1, monkeypatch):
    from torch_xla._internal import tpu

    monkeypatch.setenv("TPU_PROCESS_BOUNDS", "2,2,2")
    monkeypatch.setenv("CLOUD_TPU_TASK_ID", "5")
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "only-host")
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v2-32")
    env = tpu.get_tpu_env()
    assert (env["TPU_PROCESS_BOUNDS"], env["WORKER_ID"]) == ("2,2,2", "5")
    assert tpu.process_bounds_size() == 8
    assert tpu.task_id() == 5
    assert tpu.get_worker_ips() == ["localhost"]
    assert (tpu.version(), tpu.num_logical_cores_per_chip()) == (2, 2)
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-16")
    assert (tpu.version(), tpu.get_tpu_type()) == (5, "v5litepod")
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "x4-16")
    with pytest.raises(OSError, match="^Failed to parse TPU version from metadata$"):
        tpu.version()


def test_mesh_shape(xla_target):
    from torch_xla._internal import tpu

    shape = tpu.MeshShape.from_string("2,2,1")
    assert shape == (2, 2, 1) and shape.size == 4
    assert shape * tpu.MeshShape.from_string("1,1,2") == (2, 2, 2)
    with pytest.raises(ValueError, match=r"^Mesh shape '2,2' should be length 3$"):
        tpu.MeshShape.from_string("2,2")


def test_configure_topology(xla_target, v4_16_host_1):
    import os

    from torch_xla._internal import tpu

    tpu.configure_topology(2, 4)
    assert {name: os.environ[name] for name in _PROCESS_VARS} == {
        "TPU_PROCESS_BOUNDS": "2,2,2",
        "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
        "CLOUD_TPU_TASK_ID": "6",
        "TPU_PROCESS_ADDRESSES": "host-a:8476,host-a:8477,host-a:8478,host-a:8479,"
        "host-b:8476,host-b:8477,host-b:8478,host-b:8479",
        "TPU_VISIBLE_CHIPS": "2",
        "TPU_PROCESS_PORT": "8478",
    }
