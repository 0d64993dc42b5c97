"""Manual sharding: a sharded tensor as each device's own shard (``enable_manual_sharding``,
``_spmd_full_to_shard_shape``), per-device computation on it, and the shards as one tensor
again (``disable_manual_sharding``, ``_spmd_shard_to_full_shape``).

Every expected value here was read from real torch_xla 2.9 on PJRT CPU (4 devices,
``xr.use_spmd()``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch


def _spmd(xla_target):
    import torch_xla.runtime as xr

    if xla_target.num_devices != 4:
        pytest.skip(f"written for a 4-device slice, {xla_target} has {xla_target.num_devices}")
    xr.use_spmd()


def test_full_to_shard_gives_each_device_its_shard(xla_target):
    import torch_xla
    import torch_xla.distributed.spmd as xs

    _spmd(xla_target)
    mesh = xs.Mesh(np.arange(4), (1, 4))
    x = torch.arange(64, dtype=torch.float32).reshape(8, 8).to("xla")
    xt = xs.mark_sharding(x, mesh, (0, 1))
    xx = torch_xla._XLAC._spmd_full_to_shard_shape(xt.global_tensor)
    assert xx.shape == (8, 2)
    assert torch_xla._XLAC._get_xla_sharding_spec(xx) == "{manual}"
    # A row sum inside the region sums only the device's own two columns.
    y = xx + 1
    assert torch_xla._XLAC._get_xla_sharding_spec(y) == ""
    y = y.sum(dim=1, keepdim=True).expand(8, 2) + y
    yt = xs._mark_manual_sharding(y)
    assert yt.sharding_spec == "{manual}"
    full = torch_xla._XLAC._spmd_shard_to_full_shape(
        yt.global_tensor, mesh.get_op_sharding((0, 1)), (8, 8), torch.float32
    )
    assert torch_xla._XLAC._get_xla_sharding_spec(full) == "{devices=[1,4]0,1,2,3}"
    cols = torch.arange(64, dtype=torch.float32).reshape(8, 8) + 1
    pairs = cols.reshape(8, 4, 2)
    expected = (pairs + pairs.sum(-1, keepdim=True)).reshape(8, 8)
    assert torch.equal(full.cpu(), expected)


def test_uneven_shards_are_padded_and_trimmed(xla_target):
    import torch_xla
    import torch_xla.distributed.spmd as xs

    _spmd(xla_target)
    mesh = xs.Mesh(np.arange(4), (4, 1))
    z = torch.arange(30, dtype=torch.float32).reshape(5, 6).to("xla")
    zt = xs.mark_sharding(z, mesh, (0, None))
    zz = torch_xla._XLAC._spmd_full_to_shard_shape(zt.global_tensor)
    assert zz.shape == (2, 6)
    zz = xs._mark_manual_sharding(zz * 2).global_tensor
    zf = torch_xla._XLAC._spmd_shard_to_full_shape(
        zz, mesh.get_op_sharding((0, None)), (5, 6), torch.float32
    )
    assert torch.equal(zf.cpu(), torch.arange(30, dtype=torch.float32).reshape(5, 6) * 2)


def test_enable_disable_manual_sharding(xla_target):
    import torch_xla.distributed.spmd as xs

    _spmd(xla_target)
    xs.set_global_mesh(xs.Mesh(np.arange(4), (1, 4)))
    replicated = xs.enable_manual_sharding(torch.ones(4, 4).to("xla"), (None, None))
    assert type(replicated).__name__ == "XLAShardedTensor"
    assert (replicated.shape, replicated.sharding_spec) == ((4, 4), "{manual}")
    back = xs.disable_manual_sharding(replicated + 3, (None, None), (4, 4))
    assert back.sharding_spec == "{replicated}"
    assert torch.equal(back.global_tensor.cpu(), torch.full((4, 4), 4.0))
    # Column-sharded: each device's (4, 1) shard sums to itself along dim 1.
    cols = xs.enable_manual_sharding(torch.arange(16.0).reshape(4, 4).to("xla"), (None, 1))
    assert cols.shape == (4, 1)
    summed = cols.global_tensor.sum(1, keepdim=True) * 10
    back = xs.disable_manual_sharding(summed, (None, 1), (4, 4))
    assert torch.equal(back.global_tensor.cpu(), torch.arange(16.0).reshape(4, 4) * 10)


def test_shard_to_full_needs_a_manual_tensor(xla_target):
    import torch_xla
    import torch_xla.distributed.spmd as xs

    _spmd(xla_target)
    replicated = torch_xla._XLAC.OpSharding([], [], [], xs.ShardingType.REPLICATED)
    x = torch.zeros(8, 8).to("xla")
    with pytest.raises(RuntimeError, match="Input tensor is not sharded"):
        torch_xla._XLAC._spmd_full_to_shard_shape(x)
    x += 1
    with pytest.raises(RuntimeError, match="Input tensor is not manual sharded"):
        torch_xla._XLAC._spmd_shard_to_full_shape(x, replicated, x.shape, x.dtype)
    xt = xs.mark_sharding(x, xs.Mesh(np.arange(4), (1, 4)), (0, 1))
    with pytest.raises(RuntimeError, match="Input tensor is not manual sharded"):
        torch_xla._XLAC._spmd_shard_to_full_shape(xt.global_tensor, replicated, x.shape, x.dtype)
    # A pending (non-data) value marked manual holds the same value on every device.
    xs.clear_sharding(xt)
    manual = xs._mark_manual_sharding(xt)
    full = torch_xla._XLAC._spmd_shard_to_full_shape(
        manual.global_tensor, replicated, x.shape, x.dtype
    )
    assert torch_xla._XLAC._get_xla_sharding_spec(full) == "{replicated}"
    assert torch.equal(full.cpu(), torch.ones(8, 8))


def test_manual_region_of_a_pending_value_runs_no_graph(xla_target):
    import torch_xla
    import torch_xla.debug.metrics as met
    import torch_xla.distributed.spmd as xs

    _spmd(xla_target)
    mesh = xs.Mesh(np.arange(4), (4,), ("x",))
    t = torch.arange(16.0).reshape(4, 4).to("xla")
    torch_xla.sync()
    met.clear_all()
    pending = t * 2 + 1
    # Entering and leaving the region are nodes of the pending graph, not executions.
    local = xs.enable_manual_sharding(pending, ("x", None), mesh=mesh).global_tensor
    back = xs.disable_manual_sharding(local * 3, ("x", None), pending.shape, mesh=mesh)
    assert met.metric_data("ExecuteReplicatedTime") is None
    assert torch.equal(back.global_tensor.cpu(), (torch.arange(16.0).reshape(4, 4) * 2 + 1) * 3)
