"""The optional TPU-compiler layer: recorded graphs compiled by libtpu for a simulated slice.

Needs the ``tpu-compiler`` extra (jax[tpu] with libtpu); skipped where it is absent.
Expected figures are counted here from shapes and shardings, never read from the layer.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

if importlib.util.find_spec("jax") is None or importlib.util.find_spec("libtpu") is None:
    pytest.skip(
        "the tpu-compiler extra (jax[tpu], libtpu) is not installed", allow_module_level=True
    )

import xlasim  # noqa: E402
from tpu_backend.topology import parse_slice  # noqa: E402
from xlasim.runtime import aten_to_jax  # noqa: E402
from xlasim.runtime import graph as _graph  # noqa: E402
from xlasim.runtime import libtpu_compiler as lc  # noqa: E402
from xlasim.sharding.device_layout import device_attributes  # noqa: E402
from xlasim.sharding.mesh import Mesh  # noqa: E402

aten = torch.ops.aten


@pytest.mark.parametrize(
    ("topology", "accelerator"), [("4x4", "v5e"), ("2x2x2", "v4"), ("2x2x2", "v5p"), ("2x2", "v3")]
)
def test_topology_devices_follow_simulated_device_ids(topology, accelerator):
    spec = parse_slice(topology, accelerator)
    devices = lc.topology_devices(spec)
    assert len(devices) == spec.num_devices
    expected = [(tuple(a["coords"]), a["core_on_chip"]) for a in device_attributes(spec)]
    assert [(tuple(d.coords), d.core_on_chip) for d in devices] == expected


def test_sharding_round_trips_through_gspmd():
    spec = parse_slice("4x4", "v5e")
    devices = lc.topology_devices(spec)
    mesh = Mesh(np.arange(16), (4, 4), ("data", "model"), num_devices=16)
    for partition in (("model", None), (None, "model"), ("data", "model"), ("model", "data")):
        ours = mesh.get_op_sharding(partition)
        back = lc.op_sharding(lc.jax_sharding(ours, devices))
        assert back.to_string() == ours.to_string(), partition
    assert lc.op_sharding(lc.jax_sharding(None, devices)).to_string() == "{replicated}"


def test_in_place_ops_replay_as_their_functional_form():
    assert lc.functional_op(aten.add_.Tensor) is aten.add.Tensor
    assert lc.functional_op(aten.addcdiv_.default) is aten.addcdiv.default
    assert lc.functional_op(aten.bernoulli_.float) is aten.bernoulli.p
    assert lc.functional_op(aten.mm.default) is aten.mm.default
    with pytest.raises(NotImplementedError, match="mutating op aten.add.out"):
        lc.functional_op(aten.add.out)


def _to_jax(x: torch.Tensor):
    return aten_to_jax.jnp.asarray(x.numpy())


def test_lowerings_compute_what_torch_computes():
    # jax runs on CPU here: the lowering's numbers can be compared with eager torch.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 8, 8, generator=g)
    w = torch.randn(4, 3, 3, 3, generator=g)
    grad = torch.randn(2, 4, 4, 4, generator=g)
    args = ([2, 2], [1, 1], [1, 1], False, [0, 0], 1)
    expected = aten.convolution_backward.default(grad, x, w, [4], *args, [True, True, True])
    got = aten_to_jax.lower(aten.convolution_backward.default)(
        _to_jax(grad), _to_jax(x), _to_jax(w), [4], *args, [True, True, True]
    )
    for e, r in zip(expected, got, strict=True):
        np.testing.assert_allclose(np.asarray(r), e.numpy(), rtol=1e-4, atol=1e-4)
    h = torch.randn(4, 16, generator=g)
    weight, bias = torch.randn(16, generator=g), torch.randn(16, generator=g)
    expected = aten.native_layer_norm.default(h, [16], weight, bias, 1e-5)
    got = aten_to_jax.lower(aten.native_layer_norm.default)(
        _to_jax(h), [16], _to_jax(weight), _to_jax(bias), 1e-5
    )
    for e, r in zip(expected, got, strict=True):
        np.testing.assert_allclose(np.asarray(r), e.numpy().reshape(np.shape(r)), rtol=1e-4)


def test_an_op_without_lowering_is_named():
    with pytest.raises(NotImplementedError, match=r"aten\.cumsum\.default"):
        aten_to_jax.lower(aten.cumsum.default)


@pytest.fixture
def recording():
    _graph.RECORD_CALLS = True
    yield
    _graph.RECORD_CALLS = False


def test_sharded_training_step_figures_match_hand_counts(recording):
    d, h, batch = 256, 1024, 64
    with xlasim.simulate(topology="2x4", accelerator="v5e"):
        import torch_xla
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        xr.use_spmd()
        mesh = xs.Mesh(np.arange(8), (2, 4), ("data", "model"))
        dev = torch_xla.device()
        fc1, fc2 = torch.nn.Linear(d, h).to(dev), torch.nn.Linear(h, d, bias=False).to(dev)
        xs.mark_sharding(fc1.weight, mesh, ("model", None))
        xs.mark_sharding(fc1.bias, mesh, ("model",))
        xs.mark_sharding(fc2.weight, mesh, (None, "model"))
        params = [fc1.weight, fc1.bias, fc2.weight]
        opt = torch.optim.SGD(params, lr=0.1)
        x = torch.randn(batch, d).to(dev)
        xs.mark_sharding(x, mesh, ("data", None))
        fc2(torch.relu(fc1(x))).square().mean().backward()
        opt.step()
        pending = xlasim.current_runtime().graphs.live_pending()
        compiler = lc.LibtpuCompiler(xlasim.current_runtime().spec)
        figures = compiler.compile_pending(pending, key=1)
        assert compiler.compile_pending(pending, key=1) is figures  # cached by graph hash
        torch_xla.sync()
    f32 = 4
    params_per_chip = (h * d + h + h * d) * f32 // 4  # every parameter is split 4 ways
    x_per_chip = batch * d * f32 // 2
    assert figures.argument_bytes == params_per_chip + x_per_chip
    # SGD writes each parameter over its own buffer.
    assert figures.alias_bytes == params_per_chip
    matmul_flops = 2 * batch * d * h * 5 // 8  # forward 2, backward 3 (no gradient for x)
    assert matmul_flops <= figures.flops <= 1.2 * matmul_flops
    assert figures.step_seconds > 0


def test_graph_that_does_not_fit_raises_resource_exhausted_naming_the_input():
    spec = parse_slice("2x4", "v5e")
    compiler = lc.LibtpuCompiler(spec)
    big = (spec.hbm_bytes_per_chip // 4) * 5 // 4  # f32 elements: 1.25x one chip's HBM
    gm = torch.fx.symbolic_trace(lambda x: aten.mul.Tensor(x, 2.0))
    graph = lc.ReplayedGraph(gm, [lc.GraphInput((big,), torch.float32)], {}, 0.0)
    with pytest.raises(lc.CompileOutOfMemory, match="RESOURCE_EXHAUSTED") as caught:
        compiler.compile(graph)
    assert f"graph input 0: shape [{big}] float32 sharding {{replicated}}" in str(caught.value)


def test_a_multi_output_op_is_replayed_once(recording):
    with xlasim.simulate(topology="2x4", accelerator="v5e"):
        import torch_xla

        dev = torch_xla.device()
        norm = torch.nn.LayerNorm(16).to(dev)
        x = torch.randn(4, 16).to(dev)
        out = aten.native_layer_norm.default(x, [16], norm.weight, norm.bias, 1e-5)
        graph = lc.replay(list(out))  # output, mean and rstd: three nodes of one call
        torch_xla.sync()
    targets = [n.target for n in graph.module.graph.nodes]
    assert targets.count(aten.native_layer_norm.default) == 1
    assert len(graph.module.graph.output_node().args[0]) == 3
