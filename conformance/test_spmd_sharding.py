"""torch_xla.distributed.spmd: meshes, mark_sharding, spec strings, local shards, errors.

Every expected value here was read from real torch_xla 2.9 on PJRT CPU (4 devices,
``xr.use_spmd()``); device names differ only in their type ('CPU:0' there, 'TPU:0' on a TPU
and on the simulator), which the tests take from ``xla_target.device_type``.
"""

from __future__ import annotations

import re
from collections import OrderedDict

import numpy as np
import pytest
import torch
from messages import check_hint, raises_torch_xla, xlasim_notes


def _spmd(xla_target):
    import torch_xla.runtime as xr

    if xla_target.num_devices != 4:
        pytest.skip(f"written for a 4-device slice, {xla_target} has {xla_target.num_devices}")
    xr.use_spmd()


def test_mesh_api(xla_target):
    import torch_xla.distributed.spmd as xs

    _spmd(xla_target)
    mesh = xs.Mesh(np.arange(4), (2, 2), ("x", "y"))
    assert (
        str(mesh) == "{'device_ids': [0, 1, 2, 3], 'mesh_shape': (2, 2), 'axis_names': ('x', 'y')}"
    )
    assert mesh.shape() == OrderedDict([("x", 2), ("y", 2)])
    assert mesh.size() == 4 and isinstance(mesh.size(), np.integer)
    assert mesh.get_logical_mesh().tolist() == [[0, 1], [2, 3]]
    assert mesh.get_axis_name_idx("y") == 1
    assert mesh.get_axis_name_idx("nope") is None
    unnamed = xs.Mesh([3, 2, 1, 0], (4,))
    assert unnamed.shape() == OrderedDict([(0, 4)])
    assert unnamed.get_logical_mesh().tolist() == [3, 2, 1, 0]
    with pytest.raises(TypeError, match=r"^argument of type 'NoneType' is not iterable$"):
        unnamed.get_axis_name_idx("x")
    one_d = xs.get_1d_mesh("data")
    assert (one_d.mesh_shape, one_d.axis_names) == ((4,), ("data",))
    assert xs.get_1d_mesh().axis_names is None
    assert xs.get_global_mesh() is None
    xs.set_global_mesh(mesh)
    assert xs.get_global_mesh() is mesh
    assert str(xs.Mesh.from_str(str(mesh))) == str(mesh)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (([0, 1], (2,)), "Number of device IDs (2) must match the global number of devices (4)"),
        (([0, 1, 2, 3], (2, 2), ("x",)), "Number of axis names (1) must match mesh dimensions (2)"),
        (([0, 1, 2, 3], (2, 2), ("x", "x")), "Axis names must be unique, got: ('x', 'x')"),
        (([0, 1, 2, 3], (2, 4)), "Number of device IDs (4) must match mesh size (8)"),
        (([0, 0, 1, 2], (4,)), "Device IDs must be unique, got: [0 0 1 2]"),
        (([0, 1, 2, 7], (4,)), "Device IDs must be less than mesh size (4), got: [0 1 2 7]"),
    ],
)
def test_mesh_errors(xla_target, args, message):
    import torch_xla.distributed.spmd as xs

    _spmd(xla_target)
    with pytest.raises(AssertionError, match=f"^{re.escape(message)}$"):
        xs.Mesh(np.array(args[0]), *args[1:])


@pytest.mark.parametrize(
    ("spec", "expected", "sharding_type"),
    [
        (("x", "y"), "{devices=[2,2]0,1,2,3}", "TILED"),
        (("x", None), "{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}", "PARTIAL"),
        ((None, "y"), "{devices=[1,2,2]0,2,1,3 last_tile_dim_replicate}", "PARTIAL"),
        ((("x", "y"), None), "{devices=[4,1]0,1,2,3}", "TILED"),
        ((("y", "x"), None), "{devices=[4,1]0,2,1,3}", "TILED"),
        ((None, None), "{replicated}", "REPLICATED"),
        ((1, 0), "{devices=[2,2]0,2,1,3}", "TILED"),
    ],
)
def test_sharding_spec_strings(xla_target, spec, expected, sharding_type):
    import torch_xla
    import torch_xla.distributed.spmd as xs
    from torch.distributed.tensor import DTensor

    _spmd(xla_target)
    mesh = xs.Mesh(np.arange(4), (2, 2), ("x", "y"))
    t = torch.randn(8, 6).to("xla")
    assert torch_xla._XLAC._get_xla_sharding_spec(t) == ""
    st = xs.mark_sharding(t, mesh, spec)
    assert isinstance(st, xs.XLAShardedTensor) and isinstance(st, DTensor)
    assert st.global_tensor is t
    assert torch_xla._XLAC._get_xla_sharding_spec(t) == expected
    assert st.sharding_spec == expected
    assert st.sharding_type == xs.ShardingType[sharding_type]
    assert (st.mesh_shape, st.partition_spec) == ((2, 2), spec)


def test_device_order_and_uneven_shards(xla_target):
    """A permuted mesh, shards padded with zeros, indices clamped to the real data."""
    import torch_xla
    import torch_xla.distributed.spmd as xs

    _spmd(xla_target)
    dev = xla_target.device_type
    mesh = xs.Mesh(np.array([3, 1, 0, 2]), (2, 2), ("x", "y"))
    cpu = torch.arange(15, dtype=torch.float32).reshape(5, 3) + 1
    st = xs.mark_sharding(cpu.to("xla"), mesh, ("y", "x"))
    assert st.sharding_spec == "{devices=[2,2]3,0,1,2}"
    shards = st.local_shards
    assert [s.shard_device for s in shards] == [f"{dev}:{i}" for i in range(4)]
    assert [s.indices for s in shards] == [
        [slice(0, 3, 1), slice(2, 3, 1)],
        [slice(3, 5, 1), slice(0, 2, 1)],
        [slice(3, 5, 1), slice(2, 3, 1)],
        [slice(0, 3, 1), slice(0, 2, 1)],
    ]
    assert [s.replica_id for s in shards] == [0, 0, 0, 0]
    assert all(tuple(s.data.shape) == (3, 2) for s in shards)
    # device 1 holds rows 3..4, cols 0..1; the third row and nothing else is padding
    assert shards[1].data.tolist() == [[10.0, 11.0], [13.0, 14.0], [0.0, 0.0]]
    assert shards[0].data.tolist() == [[3.0, 0.0], [6.0, 0.0], [9.0, 0.0]]
    for s in shards:
        assert torch.equal(s.unpadded_data, cpu[tuple(s.indices)])
    assert torch.equal(st.cpu(), cpu)
    assert torch_xla._XLAC._get_xla_sharding_type(st.global_tensor) == 3


def test_partial_replication_replica_ids(xla_target):
    import torch_xla.distributed.spmd as xs

    _spmd(xla_target)
    mesh = xs.Mesh(np.array([3, 1, 0, 2]), (2, 2), ("x", "y"))
    st = xs.mark_sharding(torch.randn(5, 3).to("xla"), mesh, ("y", None))
    # groups are sorted: [3, 0] -> 0,3 and [1, 2] -> 1,2, which decides the replica ids
    assert st.sharding_spec == "{devices=[2,1,2]0,3,1,2 last_tile_dim_replicate}"
    assert [(s.indices, s.replica_id) for s in st.local_shards] == [
        ([slice(0, 3, 1), slice(0, 3, 1)], 0),
        ([slice(3, 5, 1), slice(0, 3, 1)], 0),
        ([slice(3, 5, 1), slice(0, 3, 1)], 1),
        ([slice(0, 3, 1), slice(0, 3, 1)], 1),
    ]
    replicated = xs.mark_sharding(torch.randn(5, 3).to("xla"), mesh, (None, None))
    assert [(s.indices, s.replica_id) for s in replicated.local_shards] == [
        (Ellipsis, 0),
        (Ellipsis, 1),
        (Ellipsis, 2),
        (Ellipsis, 3),
    ]


def test_scalar_and_tiny_dims(xla_target):
    import torch_xla
    import torch_xla.distributed.spmd as xs

    _spmd(xla_target)
    scalar = torch.tensor(3.0).to("xla")
    st = xs.mark_sharding(scalar, xs.get_1d_mesh("d"), ())
    assert torch_xla._XLAC._get_xla_sharding_spec(scalar) == "{replicated}"
    assert st.sharding_type == xs.ShardingType.REPLICATED
    two = xs.mark_sharding(torch.arange(2).to("xla"), xs.get_1d_mesh("d"), ("d",))
    assert [(s.data.tolist(), s.indices, s.unpadded_data.tolist()) for s in two.local_shards] == [
        ([0], [slice(0, 1, 1)], [0]),
        ([1], [slice(1, 2, 1)], [1]),
        ([0], [slice(2, 2, 1)], []),
        ([0], [slice(2, 2, 1)], []),
    ]


def test_mark_sharding_errors(xla_target):
    import torch_xla.distributed.spmd as xs

    _spmd(xla_target)
    mesh = xs.Mesh(np.arange(4), (2, 2), ("x", "y"))
    t = torch.randn(8, 6).to("xla")
    # (spec, error, torch_xla's message, a fragment of the simulator's note or None)
    axes = "has axes 0='x', 1='y'"
    cases = [
        (
            (0,),
            AssertionError,
            "Partition spec length (1) should be equal to the input rank (2).",
            None,
        ),
        (
            ("nope", None),
            ValueError,
            "Axis name nope is not defined in the given mesh",
            "'nope' is not an axis name of this mesh",
        ),
        (
            (0, 0),
            AssertionError,
            "Each device mesh dimension should appear at most once in partition_spec (0, 0).",
            "mesh axis 0 ('x') is used more than once",
        ),
        (
            ("x", ("x", "y")),
            AssertionError,
            "Each device mesh dimension should appear at most once in partition_spec (0, (0, 1)).",
            "mesh axis 0 ('x') is used more than once",
        ),
        (
            (2, None),
            AssertionError,
            "partition_spec ((2, None)) contains out of bound index into mesh_shape.",
            axes,
        ),
        (
            (-1, None),
            AssertionError,
            "partition_spec ((-1, None)) contains out of bound index into mesh_shape.",
            axes,
        ),
        (
            (("x", ("y",)), None),
            AssertionError,
            "Partition spec cannot contain nested tuples",
            None,
        ),
        (
            (0.0, None),
            ValueError,
            "Spec type <class 'float'> is not supported in partition spec",
            None,
        ),
        (
            (np.int64(0), None),
            ValueError,
            "Spec type <class 'numpy.int64'> is not supported in partition spec",
            None,
        ),
        ((["x", "y"], None), TypeError, "unhashable type: 'list'", None),
    ]
    for spec, error, message, hint in cases:
        with raises_torch_xla(error, message) as info:
            xs.mark_sharding(t, mesh, spec)
        if hint is None:
            assert xlasim_notes(info.value) == []
        else:
            check_hint(info.value, xla_target, hint)
    with raises_torch_xla(RuntimeError, "Expected XLA tensor. Got: torch.FloatTensor") as info:
        xs.mark_sharding(torch.randn(8, 6), mesh, ("x", "y"))
    check_hint(info.value, xla_target, "a cpu tensor (shape [8, 6])", "torch_xla.device()")
    with pytest.raises(
        RuntimeError,
        match=r"^Check failed: xtensor->sharding_spec\(\) != "
        r"nullptr: Tensor is not sharded$",
    ):
        _ = xs.XLAShardedTensor(torch.randn(4).to("xla")).local_shards


def test_mark_sharding_needs_spmd(xla_target):
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    if xla_target.num_devices != 4:
        pytest.skip(f"written for a 4-device slice, {xla_target} has {xla_target.num_devices}")
    assert not xr.is_spmd()
    mesh = xs.Mesh(np.arange(4), (4,), ("d",))
    with pytest.raises(
        RuntimeError,
        match=r"^Check failed: UseVirtualDevice\(\): Please enable "
        r"SPMD via `torch_xla\.runtime\.use_spmd\(\)`$",
    ):
        xs.mark_sharding(torch.randn(4).to("xla"), mesh, ("d",))
    # the SPMD check comes before the tensor check
    with pytest.raises(RuntimeError, match=r"use_spmd"):
        xs.mark_sharding(torch.randn(4), mesh, ("d",))


def test_resharding_and_clear(xla_target):
    import torch_xla
    import torch_xla.distributed.spmd as xs

    _spmd(xla_target)
    spec_of = torch_xla._XLAC._get_xla_sharding_spec
    mesh = xs.Mesh(np.arange(4), (2, 2), ("x", "y"))
    a = torch.randn(8, 6).to("xla")
    st = xs.mark_sharding(a, mesh, ("x", None))
    assert xs.mark_sharding(st, mesh, ("x", None)) is st  # same sharding again: no-op
    # protobuf's DebugString starts with a marker line it picks at random per process
    # ('goo.gle/debugproto   ', 'goo.gle/debugstr  ', 'goo.gle/debugonly    '...) so that
    # nobody parses it
    existing = (
        re.escape("Check failed: false: Existing annotation must be cleared first: ")
        + (r"goo\.gle/debug\w+ +\n")
        + re.escape(
            "type: OTHER\ntile_assignment_dimensions: 2\ntile_assignment_dimensions: 1\n"
            "tile_assignment_dimensions: 2\ntile_assignment_devices: 0\n"
            "tile_assignment_devices: 1\ntile_assignment_devices: 2\ntile_assignment_devices: 3\n"
            "replicate_on_last_tile_dim: true\n"
        )
    )
    with pytest.raises(RuntimeError, match=f"^{existing}$"):
        xs.mark_sharding(a, mesh, (None, "y"))
    assert spec_of(a) == "{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}"
    cleared = xs.clear_sharding(st)
    assert cleared is a and spec_of(a) == ""
    xs.mark_sharding(a, mesh, (None, "y"))
    assert spec_of(a) == "{devices=[1,2,2]0,2,1,3 last_tile_dim_replicate}"
    # a replicated annotation may be replaced without clearing
    b = torch.randn(8, 6).to("xla")
    xs.mark_sharding(b, mesh, (None, None))
    xs.mark_sharding(b, mesh, ("x", "y"))
    assert spec_of(b) == "{devices=[2,2]0,1,2,3}"
    assert xs.clear_sharding(b) is b


def test_sharded_math_matches_cpu(xla_target):
    import torch_xla
    import torch_xla.distributed.spmd as xs

    _spmd(xla_target)
    mesh = xs.Mesh(np.arange(4), (2, 2), ("x", "y"))
    g = torch.Generator().manual_seed(0)
    x_cpu, w_cpu = torch.randn(8, 6, generator=g), torch.randn(6, 4, generator=g)
    x, w = x_cpu.to("xla"), w_cpu.to("xla")
    xs.mark_sharding(x, mesh, ("x", "y"))
    xs.mark_sharding(w, mesh, ("y", None))
    out = (x @ w).relu().sum(0)
    torch_xla.sync()
    torch.testing.assert_close(out.cpu(), (x_cpu @ w_cpu).relu().sum(0))
    # the annotation of data tensors survives the step
    assert torch_xla._XLAC._get_xla_sharding_spec(x) == "{devices=[2,2]0,1,2,3}"


def test_sharding_spec_for_inputs(xla_target):
    import torch_xla.distributed.spmd as xs

    _spmd(xla_target)
    mesh = xs.Mesh(np.arange(4), (4,), ("data",))
    spec = xs.ShardingSpec(mesh, ("data", None))
    assert spec.can_apply(torch.ones(2, 2)) and not spec.can_apply(torch.ones(2))
    assert spec.xla_spec(torch.ones(2)) is None
    assert spec.xla_spec(torch.ones(8, 2)) is not None
    t = torch.randn(8, 2).to("xla")
    spec.apply(t)
    assert xs.XLAShardedTensor(t).sharding_spec == "{devices=[4,1]0,1,2,3}"


def test_visualize_tensor_sharding(xla_target, capsys):
    import torch_xla.distributed.spmd as xs
    from torch_xla.distributed.spmd.debugging import visualize_tensor_sharding

    _spmd(xla_target)
    mesh = xs.Mesh(np.arange(4), (2, 2), ("x", "y"))
    st = xs.mark_sharding(torch.randn(8, 6).to("xla"), mesh, ("x", None))
    table = visualize_tensor_sharding(st, use_color=False)
    out = capsys.readouterr().out
    assert out.startswith(
        "Visualizing {devices=[2,1,2]0,1,2,3 last_tile_dim_replicate} "
        "(showing up to the first two dimensions)\n"
    )
    dev = xla_target.device_type
    assert f"{dev} [0, 1]" in out and f"{dev} [2, 3]" in out
    assert table.row_count == 2


def test_sharded_training_matches_cpu(xla_target):
    """Parameters sharded FSDP-style and a data-sharded batch: the losses are eager CPU's."""
    import torch_xla
    import torch_xla.distributed.spmd as xs

    _spmd(xla_target)
    mesh = xs.Mesh(np.arange(4), (2, 2), ("data", "model"))

    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))

    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 6, generator=g), torch.randn(8, 1, generator=g)) for _ in range(3)]
    cpu_model = make()
    cpu_opt = torch.optim.SGD(cpu_model.parameters(), lr=0.1)
    expected = []
    for x, y in batches:
        cpu_opt.zero_grad()
        loss = torch.nn.functional.mse_loss(cpu_model(x), y)
        loss.backward()
        cpu_opt.step()
        expected.append(loss.item())

    model = make().to("xla")
    xs.mark_sharding(model[0].weight, mesh, ("model", None))
    xs.mark_sharding(model[2].weight, mesh, (None, "model"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x, y in batches:
        xb, yb = x.to("xla"), y.to("xla")
        xs.mark_sharding(xb, mesh, ("data", None))
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        opt.step()
        torch_xla.sync()
        losses.append(loss.item())
    assert losses == pytest.approx(expected, rel=1e-5)
    spec_of = torch_xla._XLAC._get_xla_sharding_spec
    # in-place optimizer updates keep the parameters' annotations
    assert spec_of(model[0].weight) == "{devices=[2,1,2]0,2,1,3 last_tile_dim_replicate}"
    assert spec_of(model[2].weight) == "{devices=[1,2,2]0,2,1,3 last_tile_dim_replicate}"


def test_mark_sharding_counters(xla_target):
    import torch_xla.debug.metrics as met
    import torch_xla.distributed.spmd as xs

    _spmd(xla_target)
    t = torch.randn(8, 6).to("xla")
    mesh = xs.Mesh(np.arange(4), (2, 2), ("x", "y"))
    met.clear_all()
    xs.mark_sharding(t, mesh, ("x", "y"))
    counters = {n: met.counter_value(n) for n in met.counter_names()}
    for name, value in {
        "CreateOpSharding": 1,
        "XlaMarkSharding": 1,
        "VirtualDeviceUsage": 1,
        "SetShardingSpec": 1,
        "CreateDataHandles": 4,
    }.items():
        assert counters.get(name) == value, name
    assert "TransferToDeviceTime" in met.metric_names()
    xs.mark_sharding(t, mesh, ("x", "y"))  # cached OpSharding, same annotation: a no-op
    assert met.counter_value("CreateOpSharding") == 1
    assert met.counter_value("XlaMarkSharding") == 2
    assert met.counter_value("SetShardingSpec") == 1
    met.clear_all()
    xs.mark_sharding(t + 1, mesh, ("x", None))  # a pending op result: annotated in the IR
    assert met.counter_value("XlaAnnotateCustomSharding") == 1
    assert met.counter_value("VirtualDeviceUsage") is None


def test_sharding_spec_counters_at_sync_and_after_clear(xla_target):
    """Each output of an executed SPMD program gets its spec set (sharded or replicated), an
    in-place update of a sharded tensor sets it once more, and annotating data that
    clear_sharding left in its shards gathers them first."""
    import torch_xla
    import torch_xla.debug.metrics as met
    import torch_xla.distributed.spmd as xs

    _spmd(xla_target)
    mesh = xs.Mesh(np.arange(4), (4, 1))
    t = torch.randn(8, 4).to("xla")
    xs.mark_sharding(t, mesh, (0, None))
    r = torch.randn(8, 4).to("xla")
    torch_xla.sync()

    def counts():
        return met.counter_value("SetShardingSpec"), met.counter_value("ReplicateShardedData")

    met.clear_all()
    outputs = [t + 1, t.sum(), r * 2]  # alive at the sync: the program's three outputs
    torch_xla.sync()
    assert counts() == (3, None)
    t.add_(1)
    torch_xla.sync()
    assert counts() == (5, None)
    h = t * 2
    xs.mark_sharding(h, mesh, (None, 0))
    torch_xla.sync()
    assert counts() == (7, None)
    xs.clear_sharding(h)
    assert counts() == (7, None)
    xs.mark_sharding(h, mesh, (0, None))
    assert counts() == (8, 1)
    xs.mark_sharding(r, mesh, (0, None))  # replicated data: nothing to gather
    assert counts() == (9, 1)
    assert torch.equal(h.cpu(), (t.cpu() * 2))
    assert torch.equal(outputs[2].cpu(), r.cpu() * 2)


def test_clone_keeps_the_sharding_spec(xla_target):
    """A clone carries its source's spec at once (before any sync), unlike other ops' results;
    a clone of an unsharded result has none."""
    import torch_xla
    import torch_xla.distributed.spmd as xs

    _spmd(xla_target)
    spec_of = torch_xla._XLAC._get_xla_sharding_spec
    mesh = xs.Mesh(np.arange(4), (1, 4))
    x = torch.arange(32.0).reshape(4, 8).to("xla")
    xs.mark_sharding(x, mesh, (0, 1))
    copy = x.clone()
    assert spec_of(x) == spec_of(copy) == "{devices=[1,4]0,1,2,3}"
    y = x + 1
    assert spec_of(y) == spec_of(y.clone()) == ""
    annotated = x * 2
    xs.mark_sharding(annotated, mesh, (1, 0))
    assert spec_of(annotated.clone()) == "{devices=[4,1]0,1,2,3}"
    assert copy.cpu().tolist() == torch.arange(32.0).reshape(4, 8).tolist()
