"""JAX functions on XLA tensors (``torch_xla.core.xla_builder.call_jax`` / ``JaxCallable``): JAX
(the ``tpu-compiler`` extra) jits them once per input shapes and runs them on the CPU, each call
one ``xla::jax_func`` node of the lazy graph. Without the extra, calling JAX says so."""

from __future__ import annotations

import importlib

import pytest
import torch
from extras import need_tpu_compiler, tpu_compiler_missing


def _add_sin(a, b):
    import jax.numpy as jnp

    return a + jnp.sin(b)


def test_call_jax_computes_what_jax_computes(xlasim_sim):
    # The example of call_jax's docstring in torch_xla 2.9: a + sin(b) equals the torch ops.
    need_tpu_compiler()
    import torch_xla.core.xla_builder as xb

    a = torch.ones((3, 3), device="xla")
    b = xb.call_jax(_add_sin, (a, a))
    assert b.device.type == "xla" and b.dtype == torch.float32
    torch.testing.assert_close(b.cpu(), torch.sin(torch.ones(3, 3)) + 1)


def test_a_call_is_a_pending_node_of_the_lazy_graph(xlasim_sim):
    # As in torch_xla, calling runs nothing: the node's outputs are computed when the graph
    # holding them is (one compile, one execution for both outputs).
    need_tpu_compiler()
    import torch_xla
    import torch_xla.core.xla_builder as xb
    import torch_xla.debug.metrics as met

    a = torch.arange(6.0, device="xla").reshape(2, 3)
    torch_xla.sync()
    met.clear_all()
    total, diff = xb.call_jax(lambda x, y: (x + y, x - y), (a, a * 2))
    assert met.metric_data("ExecuteTime") is None
    torch_xla.sync()
    assert met.metric_data("CompileTime")[0] == 1
    assert met.metric_data("ExecuteTime")[0] == 1
    expected = torch.arange(6.0).reshape(2, 3)
    torch.testing.assert_close(total.cpu(), expected * 3)
    torch.testing.assert_close(diff.cpu(), -expected)


def test_lowered_once_per_input_shapes_and_compiled_once(xlasim_sim):
    # torch_xla's cache: one lowering per (function, input shapes); the same lowering in each
    # step gives the same graph, compiled once.
    need_tpu_compiler()
    import torch_xla
    import torch_xla.core.xla_builder as xb
    import torch_xla.debug.metrics as met

    traces = 0

    def counted(a, b):
        nonlocal traces
        traces += 1
        return a @ b

    xb._JAX_TO_XLA_COMPUTATION_CACHE.clear()
    torch_xla.sync()
    met.clear_all()
    for step in range(3):
        a = torch.full((4, 4), float(step), device="xla")
        out = xb.call_jax(counted, (a, a))
        torch_xla.sync()
        torch.testing.assert_close(out.cpu(), torch.full((4, 4), 4.0 * step * step))
    assert traces == 1
    assert xb._jax_to_xla_computation_cache_elements() == 1
    assert met.metric_data("CompileTime")[0] == 1

    xb.call_jax(counted, (torch.ones((2, 2), device="xla"),) * 2)
    assert traces == 2
    assert xb._jax_to_xla_computation_cache_elements() == 2


def test_override_hash_shares_the_lowering_of_closures(xlasim_sim):
    need_tpu_compiler()
    import torch_xla.core.xla_builder as xb

    xb._JAX_TO_XLA_COMPUTATION_CACHE.clear()
    a = torch.ones((2,), device="xla")
    results = []
    for scale in (2.0, 3.0):

        def scaled(x, scale=scale):
            return x * scale

        results.append(xb.call_jax(scaled, (a,), override_hash="scaled").cpu())
    # The second closure was never traced: the cached lowering (scale 2) ran, as in torch_xla.
    assert xb._jax_to_xla_computation_cache_elements() == 1
    torch.testing.assert_close(results[1], torch.full((2,), 2.0))


def test_pytrees_kwargs_and_dtype_arguments(xlasim_sim):
    need_tpu_compiler()
    import torch_xla.core.xla_builder as xb

    def f(pair, *, scale, dtype):
        x, y = pair
        return {"sum": (x + y * scale).astype(dtype), "first": x}

    x = torch.tensor([1.5, 2.5], device="xla")
    y = torch.tensor([1.0, 1.0], device="xla")
    out = xb.call_jax(f, ((x, y),), {"scale": 2.0, "dtype": torch.int32})
    assert set(out) == {"sum", "first"}
    assert out["sum"].dtype == torch.int32
    assert torch.equal(out["sum"].cpu(), torch.tensor([3, 4], dtype=torch.int32))
    torch.testing.assert_close(out["first"].cpu(), torch.tensor([1.5, 2.5]))


def test_bfloat16_and_integer_values_cross_exactly(xlasim_sim):
    need_tpu_compiler()
    import torch_xla.core.xla_builder as xb

    bf = torch.tensor([1.5, -2.25, 3.0], dtype=torch.bfloat16)
    ints = torch.tensor([7, -3, 2**20], dtype=torch.int32)
    out_bf, out_int = xb.call_jax(lambda a, b: (a * 2, b + 1), (bf.to("xla"), ints.to("xla")))
    assert out_bf.dtype == torch.bfloat16 and torch.equal(out_bf.cpu(), bf * 2)
    assert torch.equal(out_int.cpu(), ints + 1)


def test_jax_callable_is_shape_generic(xlasim_sim):
    need_tpu_compiler()
    import torch_xla.core.xla_builder as xb

    doubled = xb.JaxCallable(lambda x: x * 2)
    for n in (2, 5):
        x = torch.arange(float(n))
        torch.testing.assert_close(doubled(x.to("xla")).cpu(), x * 2)
    assert len(doubled._cache) == 2


def test_a_cpu_tensor_argument_is_refused(xlasim_sim):
    # torch_xla's user computations take XLA tensors only (bridge::GetXlaTensor's error).
    need_tpu_compiler()
    import torch_xla.core.xla_builder as xb

    with pytest.raises(RuntimeError, match="Expected XLA tensor"):
        xb.call_jax(_add_sin, (torch.ones(2), torch.ones(2)))


def test_xla_callable_builds_once_per_shape(xlasim_sim):
    # XlaCallable needs no JAX: the builder's ops, one computation per input shapes.
    import torch_xla.core.xla_builder as xb

    add_mul = xb.XlaCallable(lambda a, b: (a + b, a * b))
    x = torch.tensor([1.0, 2.0])
    y = torch.tensor([3.0, 4.0])
    s, p = add_mul(x.to("xla"), y.to("xla"))
    torch.testing.assert_close(s.cpu(), x + y)
    torch.testing.assert_close(p.cpu(), x * y)
    add_mul(x.to("xla"), y.to("xla"))
    assert len(add_mul._cache) == 1


def test_without_the_extra_call_jax_names_it(xlasim_sim):
    reason = tpu_compiler_missing()
    if reason is None:
        pytest.skip("the tpu-compiler extra is installed here")
    import torch_xla.core.xla_builder as xb

    with pytest.raises(NotImplementedError, match="tpu-compiler"):
        xb.call_jax(_add_sin, (torch.ones(2, device="xla"),) * 2)


def _torchax_missing() -> str | None:
    try:
        importlib.import_module("torchax")
    except ImportError:
        return "torchax is not installed"
    except AttributeError as e:
        # torchax's import-time op tables name aten overloads of named tensors, which the torch
        # of this env no longer has.
        return f"torchax does not import with torch {torch.__version__}: {e}"
    return None


def test_assume_pure_forward_and_backward(xlasim_sim):
    # assume_pure goes through torchax (as in torch_xla 2.9): its forward and backward are one
    # call_jax each, so a training loop lowers twice however many steps it runs (torch_xla's
    # own test of assume_pure checks the same two lowerings).
    need_tpu_compiler()
    reason = _torchax_missing()
    if reason:
        pytest.skip(reason)
    import torch_xla
    import torch_xla.core.xla_builder as xb
    from torch_xla.experimental.assume_pure import assume_pure

    @assume_pure
    def sin_matmul(a, b):
        return torch.sin(a @ b)

    xb._JAX_TO_XLA_COMPUTATION_CACHE.clear()
    for _ in range(3):
        a = torch.ones((3, 3), device="xla", requires_grad=True)
        out = sin_matmul(a, a)
        out.sum().backward()
        torch_xla.sync()
    assert xb._jax_to_xla_computation_cache_elements() == 2
    # The same function traced lazily on the simulated TPU (its matmuls round as the JAX
    # node's do), as torch_xla's own assume_pure tests compare.
    ref = torch.ones((3, 3), device="xla", requires_grad=True)
    torch.sin(ref @ ref).sum().backward()
    torch.testing.assert_close(out.cpu(), torch.sin(torch.full((3, 3), 3.0)))
    assert a.grad is not None and ref.grad is not None
    torch.testing.assert_close(a.grad.cpu(), ref.grad.cpu())


def test_a_gradient_of_an_integer_input_is_a_false_pred(xlasim_sim):
    # jax.vjp's cotangent of an integer input is float0, which JAX lowers to a pred constant
    # false (its StableHLO), so torch_xla's node yields a bool tensor of that shape.
    need_tpu_compiler()
    import torch_xla.core.xla_builder as xb

    def grads(x, seed):
        import jax

        y, pullback = jax.vjp(lambda x, seed: x * 2, x, seed)
        return pullback(y)

    x = torch.ones(3, device="xla")
    seed = torch.tensor(5, dtype=torch.uint32, device="xla")
    grad_x, grad_seed = xb.call_jax(grads, (x, seed))
    torch.testing.assert_close(grad_x.cpu(), torch.full((3,), 4.0))
    assert grad_seed.dtype == torch.bool and grad_seed.shape == ()
    assert not grad_seed.cpu().item()


@pytest.mark.topology("2x2x1", accelerator="v4")
def test_sharded_inputs_are_refused_under_spmd(xlasim_sim):
    # torch_xla's partitioner would carry the shardings through the function's HLO, giving its
    # outputs shardings the simulator does not work out.
    need_tpu_compiler()
    import numpy as np
    import torch_xla.core.xla_builder as xb
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    xr.use_spmd()
    mesh = xs.Mesh(np.arange(4), (4, 1), ("model", "data"))
    replicated = torch.ones(8, 4).to("xla")
    out = xb.call_jax(_add_sin, (replicated, replicated))
    torch.testing.assert_close(out.cpu(), torch.ones(8, 4) + torch.sin(torch.ones(8, 4)))
    sharded = torch.ones(8, 4).to("xla")
    xs.mark_sharding(sharded, mesh, ("model", None))
    with pytest.raises(NotImplementedError, match="on sharded tensors"):
        xb.call_jax(_add_sin, (sharded, sharded))


@pytest.mark.topology("2x2x1", accelerator="v4")
def test_the_jax_mesh_holds_the_slice_devices_and_shards_outputs(xlasim_sim):
    # On a TPU VM, Mesh.get_jax_mesh() maps each torch_xla device id to JAX's device of that id
    # (the same chip: torch_xla's test of it compares their coords). Here JAX's devices are
    # libtpu's descriptions of the slice's devices: JAX lowers for them, the CPU runs.
    need_tpu_compiler()
    import jax
    import numpy as np
    import torch_xla
    import torch_xla.core.xla_builder as xb
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    xr.use_spmd()
    order = [2, 0, 3, 1]
    mesh = xs.Mesh(np.array(order), (2, 2), ("model", "data"))
    jax_mesh = mesh.get_jax_mesh()
    assert jax_mesh.devices.shape == (2, 2) and jax_mesh.axis_names == ("model", "data")
    assert [d.id for d in jax_mesh.devices.flat] == order
    attributes = xr.global_runtime_device_attributes()
    assert [list(d.coords) for d in jax_mesh.devices.flat] == [
        list(attributes[i]["coords"]) for i in order
    ]

    # A constraint over that mesh: libtpu's partitioner shards the output (torch_xla's result
    # of such a call carries the sharding, as its assume_pure SPMD tests check); the values
    # are the function's own, computed on the CPU without the constraint.
    mesh = xs.Mesh(np.arange(4), (2, 2), ("model", "data"))
    spec = jax.sharding.NamedSharding(mesh.get_jax_mesh(), jax.sharding.PartitionSpec("model"))
    x = torch.arange(32.0).reshape(8, 4)
    out = xb.call_jax(lambda x: jax.lax.with_sharding_constraint(x * 2, spec), (x.to("xla"),))
    same = torch.zeros(8, 4).to("xla")
    xs.mark_sharding(same, mesh, ("model", None))  # the same sharding, made by torch_xla's API
    torch_xla.sync()
    spec_text = torch_xla._XLAC._get_xla_sharding_spec(same)
    assert spec_text == "{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}"
    assert torch_xla._XLAC._get_xla_sharding_spec(out) == spec_text
    torch.testing.assert_close(out.cpu(), x * 2)


def test_a_dry_run_gets_the_output_shapes_without_values(xlasim_sim):
    need_tpu_compiler()
    import xlasim

    with xlasim.simulate(topology="2x2", dry_run=True):
        import torch_xla
        import torch_xla.core.xla_builder as xb

        x = torch.ones((3, 5), device=torch_xla.device())
        gram, total = xb.call_jax(lambda x: (x.T @ x, x.sum()), (x,))
        torch_xla.sync()
        assert (gram.shape, gram.dtype) == (torch.Size([5, 5]), torch.float32)
        assert total.shape == ()


def test_float32_matmuls_round_as_the_simulated_tpu_does(xlasim_sim):
    # On a TPU a float32 dot at JAX's DEFAULT precision is one pass over bfloat16-rounded
    # operands (JAX's documentation of lax.Precision), as the simulator's own matmuls at
    # torch_xla's default precision; HIGHEST is float32.
    need_tpu_compiler()
    import jax
    import jax.numpy as jnp
    import torch_xla.core.xla_builder as xb

    torch.manual_seed(0)
    a, b = torch.randn(16, 32), torch.randn(32, 8)
    xa, xb_ = a.to("xla"), b.to("xla")
    lazy = (xa @ xb_).cpu()
    exact = a @ b
    rounded = a.bfloat16().float() @ b.bfloat16().float()

    def in_a_loop(x, y):
        # A scan's body is rewritten too.
        return jax.lax.scan(lambda c, _: (c, jnp.dot(c, y)), x, None, length=1)[1][0]

    for fn in (jnp.matmul, in_a_loop):
        out = xb.call_jax(fn, (xa, xb_)).cpu()
        torch.testing.assert_close(out, lazy, rtol=0, atol=1e-5)
        torch.testing.assert_close(out, rounded, rtol=0, atol=1e-5)
        assert (out - exact).abs().max() > 1e-3

    def highest(x, y):
        return jnp.dot(x, y, precision=jax.lax.Precision.HIGHEST)

    torch.testing.assert_close(xb.call_jax(highest, (xa, xb_)).cpu(), exact)
