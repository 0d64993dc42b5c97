"""``torch_xla._XLAC._get_xla_tensor_debug_info`` under SPMD, and the upload torch_xla defers
from ``.to('xla')`` to a tensor's first use (or its sharding).

Every expected text here was read from real torch_xla 2.9 on PJRT CPU (4 devices,
``xr.use_spmd()``); only the TensorID/AliasID numbers, which count every tensor the process
made, are left out of the comparison.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch


def _spmd(xla_target):
    import torch_xla.runtime as xr

    if xla_target.num_devices != 4:
        pytest.skip(f"written for a 4-device slice, {xla_target} has {xla_target.num_devices}")
    xr.use_spmd()


def _info(t):
    import torch_xla

    text = torch_xla._XLAC._get_xla_tensor_debug_info(t)
    ids = re.findall(r"^(?:TensorID|AliasID): (\d+)$", text, re.M)
    assert len(ids) == 2 and ids[0] == ids[1]
    return re.sub(r"^(TensorID|AliasID): \d+$", r"\1: N", text, flags=re.M)


def _transfers(met):
    data = met.metric_data("TransferToDeviceTime")
    return 0 if data is None else data[0]


def test_data_stays_on_the_host_until_first_use(xla_target):
    import torch_xla.debug.metrics as met

    _spmd(xla_target)
    met.clear_all()
    t = torch.randn(5, 7).to("xla")
    assert _info(t) == (
        "XLATensor {\nTensorID: N\nAliasID: N\nDevice: SPMD:0\nXLA Shape: f32[5,7]\n"
        "ShardingSpec: None\nIR: None\nXLAData: None\nTensor on host: with size [5, 7]\n}\n"
    )
    assert _transfers(met) == 0
    # (no Python scalars in these ops: torch_xla uploads a scalar operand as well)
    kept = t + t
    assert _transfers(met) == 1  # used by an op: uploaded now
    assert _info(t) == (
        "XLATensor {\nTensorID: N\nAliasID: N\nDevice: SPMD:0\nXLA Shape: f32[5,7]\n"
        "ShardingSpec: None\nIR: [UNKNOWN_SCALAR[]] xla::device_data, xla_shape=f32[5,7]{1,0}, "
        "dynamic_dims: (), device=SPMD:0\nXLAData: None\nTensor on host: None\n}\n"
    )
    kept - t  # used again: nothing more to send
    assert _transfers(met) == 1


def test_sharding_uploads_the_shards(xla_target):
    import torch_xla.debug.metrics as met
    import torch_xla.distributed.spmd as xs

    _spmd(xla_target)
    mesh = xs.Mesh(np.arange(4), (1, 4))
    t = torch.randn(3, 8, dtype=torch.float64).to("xla")
    met.clear_all()
    xs.mark_sharding(t, mesh, (0, 1))
    assert _transfers(met) == 1
    assert _info(t) == (
        "XLATensor {\nTensorID: N\nAliasID: N\nDevice: SPMD:0\nXLA Shape: f64[3,8]\n"
        "ShardingSpec: {devices=[1,4]0,1,2,3}\nIR: [UNKNOWN_SCALAR[]] xla::device_data, "
        "xla_shape=f64[3,8]{1,0}, dynamic_dims: (), device=SPMD:0\nXLAShardedData: \n"
        "  Data Device: SPMD:0\n  Data Shape: f64[3,8]\n  OpSharding: {devices=[1,4]0,1,2,3}\n"
        "  NumShards: 4\nTensor on host: None\n}\n"
    )
    (t + t).sum()  # already on the devices
    assert _transfers(met) == 1


def test_sharded_send_cpu_data_to_device(xla_target):
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.spmd as xs

    _spmd(xla_target)
    spec = xs.ShardingSpec(xs.Mesh(np.arange(4), (4, 1)), (0, None))
    (t,) = xm.send_cpu_data_to_device([torch.ones(4, 2)], torch_xla.device(), spec)
    info = _info(t)
    assert "ShardingSpec: {devices=[4,1]0,1,2,3}\n" in info
    assert "xla::device_data, xla_shape=f32[4,2]{1,0}" in info
    assert "Tensor on host: None\n" in info


def test_after_a_step_barrier(xla_target):
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.spmd as xs

    _spmd(xla_target)
    spec = xs.ShardingSpec(xs.Mesh(np.arange(4), (1, 4)), (0, 1))
    (moved,) = xm.send_cpu_data_to_device([torch.randn(3, 5)], torch_xla.device(), spec)
    halved = moved / 0.5
    tripled = torch.randn(9).to("xla") * 3
    torch_xla.sync(wait=True)

    def data(shape, sharding):
        return (
            f"XLAShardedData: \n  Data Device: SPMD:0\n  Data Shape: {shape}\n"
            f"  OpSharding: {sharding}\n  NumShards: 4\nTensor on host: None\n}}\n"
        )

    head = "XLATensor {\nTensorID: N\nAliasID: N\nDevice: SPMD:0\n"
    tiled = "{devices=[1,4]0,1,2,3}"
    # graph outputs: plain (sharded) data, no IR value
    assert _info(halved) == (
        head + f"XLA Shape: f32[3,5]\nShardingSpec: {tiled}\nIR: None\n" + data("f32[3,5]", tiled)
    )
    assert _info(tripled) == (
        head
        + "XLA Shape: f32[9]\nShardingSpec: {replicated}\nIR: None\n"
        + data("f32[9]", "{replicated}")
    )
    # sharded data moved from the host keeps its device_data value across the barrier
    assert _info(moved) == (
        head + f"XLA Shape: f32[3,5]\nShardingSpec: {tiled}\nIR: [UNKNOWN_SCALAR[]] "
        "xla::device_data, xla_shape=f32[3,5]{1,0}, dynamic_dims: (), device=SPMD:0\n"
        + data("f32[3,5]", tiled)
    )
