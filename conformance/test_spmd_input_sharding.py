"""Input sharding on host-to-device transfers (``send_cpu_data_to_device`` / MpDeviceLoader).

Read from real torch_xla 2.9 on PJRT CPU (4 devices, SPMD): a transfer under SPMD comes back
'{replicated}' even without an input sharding (a plain ``.to('xla')`` stays ''); a
ShardingSpec that does not fit a tensor's rank leaves it replicated; with ``minibatch`` each
device takes the next chunk of the host batch in device order, so a permuted mesh permutes
the global batch.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch


def test_transfers_with_and_without_input_sharding(xla_target):
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    if xla_target.num_devices != 4:
        pytest.skip(f"written for a 4-device slice, {xla_target} has {xla_target.num_devices}")
    xr.use_spmd()
    spec_of = torch_xla._XLAC._get_xla_sharding_spec
    device = torch_xla.device()
    assert spec_of(torch.ones(3).to("xla")) == ""
    (plain,) = xm.send_cpu_data_to_device(torch.ones(4, 2), device)
    assert spec_of(plain) == "{replicated}"

    mesh = xs.Mesh(np.array([3, 2, 1, 0]), (4,), ("data",))
    batch = torch.arange(8.0).reshape(4, 2)
    (x,) = xm.send_cpu_data_to_device(batch, device, xs.ShardingSpec(mesh, ("data", None)))
    assert spec_of(x) == "{devices=[4,1]3,2,1,0}"
    assert x.cpu().tolist() == batch.tolist()
    assert [s.data.tolist() for s in xs.XLAShardedTensor(x).local_shards] == [
        [[6.0, 7.0]],
        [[4.0, 5.0]],
        [[2.0, 3.0]],
        [[0.0, 1.0]],
    ]
    minibatch = xs.ShardingSpec(mesh, ("data", None), minibatch=True)
    (m,) = xm.send_cpu_data_to_device(batch, device, minibatch)
    assert spec_of(m) == "{devices=[4,1]3,2,1,0}"
    assert m.cpu().tolist() == [[6.0, 7.0], [4.0, 5.0], [2.0, 3.0], [0.0, 1.0]]
    assert [s.data.tolist() for s in xs.XLAShardedTensor(m).local_shards] == [
        [[0.0, 1.0]],
        [[2.0, 3.0]],
        [[4.0, 5.0]],
        [[6.0, 7.0]],
    ]
    (vector,) = xm.send_cpu_data_to_device(
        torch.ones(3), device, xs.ShardingSpec(mesh, ("data", None))
    )
    assert spec_of(vector) == "{replicated}"
    out = xm.send_cpu_data_to_device(
        {"a": torch.ones(4, 2), "b": [torch.ones(4, 3)]},
        device,
        xs.ShardingSpec(mesh, ("data", None)),
    )
    assert spec_of(out["a"]) == spec_of(out["b"][0]) == "{devices=[4,1]3,2,1,0}"
    message = (
        "When minibatch is configured, the per-host batch size must be divisible by local "
        "runtime device count. Per host input data shape = torch.Size([3, 2]), "
        "local_runtime_device_count = 4"
    )
    with pytest.raises(RuntimeError, match=f"^{re.escape(message)}$"):
        xm.send_cpu_data_to_device(torch.ones(3, 2), device, minibatch)


def test_device_loader_batch_forms(xla_target):
    """MpDeviceLoader hands back each batch as the loader gave it (a lone tensor unwrapped),
    and a dict ``input_sharding`` shards each key of a dict batch with its own spec."""
    import torch_xla
    import torch_xla.distributed.parallel_loader as pl
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    if xla_target.num_devices != 4:
        pytest.skip(f"written for a 4-device slice, {xla_target} has {xla_target.num_devices}")
    xr.use_spmd()
    spec_of = torch_xla._XLAC._get_xla_sharding_spec
    device = torch_xla.device()
    mesh = xs.Mesh(np.arange(4), (4,), ("data",))
    rows = xs.ShardingSpec(mesh, ("data", None))

    def first(batch, input_sharding):
        return next(iter(pl.MpDeviceLoader([batch], device, input_sharding=input_sharding)))

    lone = first(torch.arange(8.0).reshape(4, 2), rows)
    assert isinstance(lone, torch.Tensor) and lone.device.type == "xla"
    assert spec_of(lone) == "{devices=[4,1]0,1,2,3}"
    assert lone.cpu().tolist() == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0]]

    batch = {"x": torch.ones(4, 2), "y": torch.ones(4, 3, 5)}
    per_key = first(batch, {"x": rows, "y": xs.ShardingSpec(mesh, (None, None, "data"))})
    assert spec_of(per_key["x"]) == "{devices=[4,1]0,1,2,3}"
    assert spec_of(per_key["y"]) == "{devices=[1,1,4]0,1,2,3}"
    unsharded = first(batch, {})
    assert spec_of(unsharded["x"]) == spec_of(unsharded["y"]) == "{replicated}"

    with pytest.raises(KeyError, match=re.escape("Keys: ['y'] are missing from input_sharding.")):
        first(batch, {"x": rows})
    with pytest.raises(
        ValueError, match="^input batch should be a dict when input sharding is a dict.$"
    ):
        first(torch.ones(4, 2), {"x": rows})
