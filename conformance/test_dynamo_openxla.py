"""``torch.compile(backend="openxla")`` and ``torch.ops.xla.dynamo_mark_sharding``, as real
torch_xla 2.9 runs them (counts read on PJRT CPU with 4 devices).

The first call traces the graph once and compiles it ahead (one ``CompileTime``, no run of
that trace); every call then runs the compiled program (one ``ExecuteTime`` each, no cache
lookup). An input that still holds pending IR is synced first; under SPMD an input whose
sharding changed makes a new trace and compile.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch


def _count(met, name):
    return met.counter_value(name) or 0


def _samples(met, name):
    data = met.metric_data(name)
    return data[0] if data else 0


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def test_openxla_inference_compiles_once_runs_each_call(xla_target):
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met

    dev = torch_xla.device()
    reference = _model().eval()
    model = _model().to(dev).eval()
    xs = [torch.randn(4, 8) for _ in range(3)]
    on_dev = [x.to(dev) for x in xs]
    torch_xla.sync()
    met.clear_all()
    torch_xla.sync()
    compiled = torch.compile(model, backend="openxla")

    first = compiled(on_dev[0])
    xm.wait_device_ops()  # torch_xla records an execution's time after its results are ready
    assert _count(met, "DynamoExtractCompiledGraph") == 1
    # Looking for CPU fallbacks clears the counters (but two) before each node of the graph:
    # what is left is the sync of the trace that followed.
    assert _count(met, "MarkStep") == 1
    assert _samples(met, "CompileTime") == 1
    assert _samples(met, "ExecuteTime") == 1
    assert _count(met, "UncachedCompile") == 1
    assert _count(met, "CachedCompile") == 0
    assert "IR: None" in torch_xla._XLAC._get_xla_tensor_debug_info(first)

    second = compiled(on_dev[1])
    xm.wait_device_ops()
    assert _samples(met, "CompileTime") == 1
    assert _samples(met, "ExecuteTime") == 2
    assert _count(met, "CachedCompile") == 0
    assert _count(met, "ExecuteComputation") == 0
    assert _count(met, "DynamoSyncInputExecuteTime") == 0

    # A pending input is synced first: its own graph compiles and runs.
    third = compiled(on_dev[2] + 1)
    xm.wait_device_ops()
    assert _count(met, "DynamoSyncInputExecuteTime") == 1
    assert _samples(met, "CompileTime") == 2
    assert _count(met, "ExecuteComputation") == 1
    assert _samples(met, "ExecuteTime") == 4
    assert _count(met, "DynamoExtractCompiledGraph") == 1

    with torch.no_grad():
        expected = [reference(xs[0]), reference(xs[1]), reference(xs[2] + 1)]
    for got, want in zip((first, second, third), expected, strict=True):
        assert got.device.type == "xla"
        assert torch.allclose(got.cpu(), want, atol=1e-6)


def test_openxla_training_step_matches_cpu(xla_target):
    import torch_xla
    import torch_xla.debug.metrics as met

    dev = torch_xla.device()
    reference = _model()
    model = _model().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    loss_fn = torch.nn.MSELoss()
    data, target = torch.randn(6, 8), torch.randn(6, 2)
    compiled = torch.compile(model, backend="openxla")
    met.clear_all()

    losses, ref = [], []
    for _ in range(3):
        opt.zero_grad()
        loss = loss_fn(compiled(data.to(dev)), target.to(dev))
        loss.backward()
        opt.step()
        torch_xla.sync()
        losses.append(loss.item())
        ref_opt.zero_grad()
        ref_loss = loss_fn(reference(data), target)
        ref_loss.backward()
        ref_opt.step()
        ref.append(ref_loss.item())
    assert losses == pytest.approx(ref, rel=1e-5)
    # One forward and one backward graph, extracted once each.
    assert _count(met, "DynamoExtractCompiledGraph") == 2


def _spmd_mesh(xla_target):
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    if xla_target.num_devices != 4:
        pytest.skip(f"written for a 4-device slice, {xla_target} has {xla_target.num_devices}")
    xr.use_spmd()
    return xs.Mesh(np.arange(4), (1, 4), ("x", "y"))


def test_openxla_retraces_when_an_input_sharding_changes(xla_target):
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met
    import torch_xla.distributed.spmd as xs

    mesh = _spmd_mesh(xla_target)
    dev = torch_xla.device()

    def fn(a, b):
        return a * 2 + b

    x_cpu, y_cpu = torch.randn(8, 16), torch.randn(8, 16)
    x, y = x_cpu.to(dev), y_cpu.to(dev)
    torch_xla.sync()
    met.clear_all()
    compiled = torch.compile(fn, backend="openxla")
    out = compiled(x, y)
    xm.wait_device_ops()
    assert _samples(met, "CompileTime") == 1
    assert _samples(met, "ExecuteReplicatedTime") >= 1

    compiled(x, y)
    xm.wait_device_ops()
    assert _samples(met, "CompileTime") == 1

    xs.mark_sharding(x, mesh, (1, 0))
    sharded = compiled(x, y)
    xm.wait_device_ops()
    assert _samples(met, "CompileTime") == 2  # traced and compiled again, not extracted
    assert _count(met, "DynamoExtractCompiledGraph") == 1
    assert torch.allclose(out.cpu(), x_cpu * 2 + y_cpu)
    assert torch.allclose(sharded.cpu(), x_cpu * 2 + y_cpu)


def test_dynamo_mark_sharding_op(xla_target):
    import torch_xla
    import torch_xla.core.xla_model as xm

    mesh = _spmd_mesh(xla_target)
    dev = torch_xla.device()
    ids, shape, names = mesh.device_ids.tolist(), list(mesh.mesh_shape), str(mesh.axis_names)

    w = torch.randn(4, 8).to(dev)
    torch.ops.xla.dynamo_mark_sharding(w, ids, shape, names, "(1, 0)")
    assert torch_xla._XLAC._get_xla_sharding_spec(w) == "{devices=[4,1]0,1,2,3}"

    cpu = torch.randn(4, 8)
    assert torch.ops.xla.dynamo_mark_sharding(cpu, ids, shape, names, "(1, 0)") is cpu

    def marks_an_activation(t):
        torch.ops.xla.dynamo_mark_sharding(t + 1, ids, shape, names, "(0, 1)")
        return t * 2

    values = torch.randn(4, 8)
    got = torch.compile(marks_an_activation, backend="openxla")(values.to(dev))
    xm.wait_device_ops()
    assert torch.allclose(got.cpu(), values * 2)

    def uses_the_marked_value(t):
        u = t + 1
        torch.ops.xla.dynamo_mark_sharding(u, ids, shape, names, "(0, 1)")
        return u * 2

    # What the op gives back is an XLAShardedTensor, which the bridge refuses as an output.
    with pytest.raises(RuntimeError, match="Expected XLA tensor. Got: XLAFloatType"):
        torch.compile(uses_the_marked_value, backend="openxla")(values.to(dev))
