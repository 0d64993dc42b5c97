"""XLAShardedTensor as a DTensor, redistribute, shard round trips, and the small spmd helpers.

Every expected value here was read from real torch_xla 2.9 on PJRT CPU (4 devices,
``xr.use_spmd()``).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from messages import raises_torch_xla


def _spmd_mesh(xla_target):
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    if xla_target.num_devices != 4:
        pytest.skip(f"written for a 4-device slice, {xla_target} has {xla_target.num_devices}")
    xr.use_spmd()
    return xs.Mesh(np.arange(4), (2, 2), ("x", "y"))


def _grid(rows, cols):
    return torch.arange(rows * cols, dtype=torch.float32).reshape(rows, cols)


def test_dtensor_view_of_the_layout(xla_target):
    import torch_xla.distributed.spmd as xs
    from torch.distributed.tensor.placement_types import Replicate, Shard

    mesh = _spmd_mesh(xla_target)
    a = _grid(4, 6).to("xla")
    st = xs.mark_sharding(a, mesh, (None, 0))
    # placement per mesh dim: mesh dim 0 shards tensor dim 1, mesh dim 1 shards nothing
    assert st.placements == (Shard(1), Replicate())
    spec = st._spec
    assert st._spec is spec  # built once
    assert spec.mesh.device_type == "xla" and spec.mesh.mesh.tolist() == [[0, 1], [2, 3]]
    meta = spec.tensor_meta
    assert (tuple(meta.shape), meta.stride, meta.dtype) == ((4, 6), (6, 1), torch.float32)
    # only integer entries name mesh dims; the first tensor dim naming one wins
    assert xs.mark_sharding(_grid(4, 6).to("xla"), mesh, ("x", None)).placements == (
        Replicate(),
        Replicate(),
    )
    named = xs.XLAShardedTensor(a, mesh_shape=(2, 2), partition_spec=("x", 1))
    assert named.placements == (Replicate(), Shard(1))
    assert xs.XLAShardedTensor(a, mesh_shape=(2, 2), partition_spec=(1, 1)).placements == (
        Replicate(),
        Shard(0),
    )
    # wrapping again keeps the layout unless a new one is given
    again = xs.XLAShardedTensor(st)
    assert (again.mesh_shape, again.partition_spec) == ((2, 2), (None, 0))
    assert xs.XLAShardedTensor(st, partition_spec=(0, None)).partition_spec == (0, None)


def test_dtensor_view_needs_a_layout(xla_target):
    import torch_xla.distributed.spmd as xs

    _spmd_mesh(xla_target)
    a = _grid(4, 6).to("xla")
    missing = (
        "{} must be specified to create DTensorSpec. If this tensor was created through torch "
        "operations, it may be auto-wrapped. Use wrap_as_sharded_tensor() to set {} before "
        "accessing _spec. "
    )
    bare = xs.XLAShardedTensor(a)
    with pytest.raises(ValueError, match=f"^{re.escape(missing.format(*['mesh_shape'] * 2))}$"):
        _ = bare._spec
    half = xs.XLAShardedTensor(a, mesh_shape=(2, 2))
    spec_missing = missing.format(*["partition_spec"] * 2)
    with pytest.raises(ValueError, match=f"^{re.escape(spec_missing)}$"):
        _ = half._spec
    placements = (
        "Placements not available: XLAShardedTensor requires mesh_shape and partition_spec to "
        "be set. Use mark_sharding() to properly initialize sharding information."
    )
    for incomplete in (bare, half):
        with pytest.raises(ValueError, match=f"^{re.escape(placements)}$"):
            _ = incomplete.placements
    grad = xs.XLAShardedTensor(a, requires_grad=True)
    # the wrapper is the autograd leaf; the data it holds is a detached alias
    assert grad.requires_grad and grad.global_tensor is not a
    assert not grad.global_tensor.requires_grad
    assert xs.XLAShardedTensor(a).global_tensor is a


def test_redistribute(xla_target):
    import torch_xla.distributed.spmd as xs
    from torch.distributed.tensor.placement_types import Partial, Replicate, Shard

    mesh = _spmd_mesh(xla_target)
    b = _grid(4, 6).to("xla")
    sb = xs.mark_sharding(b, mesh, ("x", None))
    with pytest.raises(
        ValueError, match=r"^Number of placements \(1\) must match mesh dimensions \(2\)$"
    ):
        sb.redistribute(mesh, [Replicate()])
    with pytest.raises(
        NotImplementedError,
        match="^Partial placement is not yet implemented and may have unexpected behavior. "
        "Use Shard or Replicate placements instead.$",
    ):
        sb.redistribute(mesh, [Partial(), Replicate()])
    with pytest.raises(
        IndexError, match="^Shard dimension 2 is out of bounds for tensor with 2 dimensions$"
    ):
        sb.redistribute(mesh, [Shard(2), Replicate()])

    moved = sb.redistribute(mesh, [Replicate(), Shard(0)])
    assert moved.global_tensor is b
    assert (moved.partition_spec, moved.mesh_shape) == ((1, None), (2, 2))
    assert moved.sharding_spec == sb.sharding_spec
    assert sb.sharding_spec == "{devices=[2,1,2]0,2,1,3 last_tile_dim_replicate}"
    # the later of two placements on one tensor dim wins
    assert sb.redistribute(mesh, [Shard(0), Shard(0)]).partition_spec == (1, None)

    c = _grid(4, 6).to("xla")
    sc = xs.mark_sharding(c, mesh, ("x", None))
    copy = sc.redistribute(mesh, [Shard(1), Shard(0)], async_op=True)
    # async_op annotates a copy; the original keeps its sharding
    assert copy.global_tensor is not c and copy.partition_spec == (1, 0)
    assert copy.sharding_spec == "{devices=[2,2]0,2,1,3}"
    assert sc.sharding_spec == "{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}"
    assert torch.equal(copy.global_tensor.cpu(), _grid(4, 6))


def test_repr_shows_the_global_tensor(xla_target):
    import torch_xla.distributed.spmd as xs

    mesh = _spmd_mesh(xla_target)
    st = xs.mark_sharding(_grid(2, 3).to("xla"), mesh, ("x", None))
    expected = "XLAShardedTensor(tensor([[0., 1., 2.],\n        [3., 4., 5.]], device='xla:0'))"
    assert repr(st) == expected
    assert str(st) == expected


def test_local_shards_round_trip(xla_target):
    import torch_xla.distributed.spmd as xs

    mesh = _spmd_mesh(xla_target)
    sd = xs.mark_sharding(_grid(5, 6).to("xla"), mesh, ("x", "y"))
    assert sd.placements  # builds the cached DTensor spec, which loading shards must drop
    assert sd._cached_spec is not None
    shards = sd.local_shards
    # uneven rows: 3 + 2, each shard padded to 3 rows
    assert [tuple(s.data.shape) for s in shards] == [(3, 3)] * 4
    assert [tuple(s.unpadded_data.shape) for s in shards] == [(3, 3), (3, 3), (2, 3), (2, 3)]
    for s in shards:
        s.unpadded_data = -s.unpadded_data  # writes through into the padded data
    assert shards[2].data.tolist() == [[-18.0, -19.0, -20.0], [-24.0, -25.0, -26.0], [0, 0, 0]]
    sd.load_local_shards_(shards)
    assert sd._cached_spec is None
    assert torch.equal(sd.global_tensor.cpu(), -_grid(5, 6))

    rep = xs.mark_sharding(torch.ones(2, 2).to("xla"), mesh, (None, None))
    replicas = rep.local_shards
    assert [(s.indices, s.replica_id) for s in replicas] == [(Ellipsis, i) for i in range(4)]
    replicas[0].unpadded_data = torch.zeros(2, 2)  # a replica has no padding: all of it
    assert replicas[0].data.tolist() == [[0.0, 0.0], [0.0, 0.0]]


def test_wrap_if_sharded_and_clear_sharding(xla_target):
    import torch_xla
    import torch_xla.distributed.spmd as xs

    mesh = _spmd_mesh(xla_target)
    plain = torch.ones(3).to("xla")
    assert xs.wrap_if_sharded(plain) is plain  # not annotated
    cpu = torch.ones(2)
    assert xs.wrap_if_sharded(cpu) is cpu and xs.wrap_if_sharded(3) == 3
    a = _grid(4, 6).to("xla")
    st = xs.mark_sharding(a, mesh, ("x", None))
    assert xs.wrap_if_sharded(st) is st
    wrapped = xs.wrap_if_sharded(a)
    assert type(wrapped) is xs.XLAShardedTensor and wrapped.global_tensor is a
    assert wrapped.mesh_shape is None  # the layout is not recovered from the annotation

    e = torch.ones(4, 4).to("xla")
    se = xs.mark_sharding(e, mesh, ("x", "y"))
    assert xs.clear_sharding(se) is e
    assert torch_xla._XLAC._get_xla_sharding_spec(e) == "" and se.sharding_spec == ""
    with raises_torch_xla(RuntimeError, "Expected XLA tensor. Got: torch.FloatTensor"):
        xs.clear_sharding(torch.ones(2))


def test_mark_sharding_with_gradients(xla_target):
    import torch_xla
    import torch_xla.distributed.spmd as xs

    mesh = _spmd_mesh(xla_target)
    spec_of = torch_xla._XLAC._get_xla_sharding_spec
    x = torch.randn(4, 6).to("xla").requires_grad_(True)
    y = xs.mark_sharding_with_gradients(x, mesh, ("x", None))
    # not in place: a new tensor carries the sharding
    assert y is not x and not isinstance(y, xs.XLAShardedTensor)
    assert spec_of(y) == "{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}"
    (y * 2).sum().backward()
    torch_xla.sync()
    # the gradient is sharded the same way
    assert spec_of(x.grad) == "{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}"
    assert x.grad.cpu().tolist() == [[2.0] * 6] * 4
    with pytest.raises(
        AssertionError,
        match=r"^Partition spec length \(1\) should be equal to the input rank \(2\)\.$",
    ):
        xs.mark_sharding_with_gradients(x, mesh, ("x",))


def test_op_mixing_sharded_wrapper_and_plain_xla_tensors(xla_target):
    import torch_xla.distributed.spmd as xs

    mesh = _spmd_mesh(xla_target)
    x = _grid(4, 6).to("xla")
    wrapped = xs.mark_sharding(x, mesh, (0, 1))
    layer = torch.nn.Linear(6, 3).to("xla")
    # the plain parameter comes first in addmm's arguments: the wrapper still wins
    out = layer(wrapped)
    assert isinstance(out, xs.XLAShardedTensor)
    assert "XLAShardedTensor" in str(out)
    plain = layer(x)
    assert not isinstance(plain, xs.XLAShardedTensor)
    assert "XLAShardedTensor" not in str(plain)
