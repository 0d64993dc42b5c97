"""The optional TPU-compiler layer against the real libtpu (the ``tpu-compiler`` extra).

Skipped with its reason where the extra is absent; the ``tpu-compiler`` tox env requires it.
Expected figures are counted here from shapes and shardings, never read from the layer.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from extras import need_tpu_compiler

need_tpu_compiler(module_level=True)

import xlasim  # noqa: E402
from tpu_backend.topology import parse_slice  # noqa: E402
from xlasim.runtime.compiler import aten_to_jax  # noqa: E402
from xlasim.runtime.compiler import libtpu as lc  # noqa: E402
from xlasim.sharding.device_layout import device_attributes  # noqa: E402
from xlasim.sharding.mesh import Mesh  # noqa: E402

aten = torch.ops.aten
GIB = 1 << 30
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("topology", "accelerator"), [("4x4", "v5e"), ("2x2x2", "v4"), ("2x2x2", "v5p"), ("2x2", "v3")]
)
def test_topology_devices_follow_simulated_device_ids(topology, accelerator):
    spec = parse_slice(topology, accelerator)
    devices = lc.topology_devices(spec)
    assert len(devices) == spec.num_devices
    expected = [(tuple(a["coords"]), a["core_on_chip"]) for a in device_attributes(spec)]
    assert [(tuple(d.coords), d.core_on_chip) for d in devices] == expected


def test_a_multislice_topology_is_libtpus_own_slice_by_slice():
    # jax's get_topology_desc(..., num_slices=2) lays out both slices, each device carrying its
    # slice_index; the simulator numbers a multislice job's devices slice by slice
    spec = parse_slice("2x2x1", "v4")
    devices = lc.topology_devices(spec, 2)
    expected = [(s, tuple(a["coords"])) for s in (0, 1) for a in device_attributes(spec)]
    assert [(d.slice_index, tuple(d.coords)) for d in devices] == expected


def test_a_data_parallel_step_across_two_slices_compiles_with_a_slice_of_the_batch_each():
    batch, d, h = 64, 128, 256
    with xlasim.simulate(
        "2x2x1", "v4", num_slices=2, single_process=True, compiler="libtpu", dry_run=True
    ):
        import torch_xla
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        xr.use_spmd()
        mesh = xs.HybridMesh(
            ici_mesh_shape=(1, 4), dcn_mesh_shape=(2, 1), axis_names=("data", "model")
        )
        dev = torch_xla.device()
        x = torch.randn(batch, d).to(dev)
        w = torch.randn(d, h).to(dev)
        xs.mark_sharding(x, mesh, ("data", None))
        xs.mark_sharding(w, mesh, (None, "model"))
        loss = (x @ w).square().sum()
        torch_xla.sync()
        (figures,) = xlasim.compiled_graphs()
    f32 = 4
    # per device: half the batch (one slice's), a quarter of the weight's columns
    assert figures.argument_bytes == batch // 2 * d * f32 + d * h // 4 * f32
    # one matmul's share per device, plus the squares and the sums
    share = 2 * (batch // 2) * d * (h // 4)
    assert share <= figures.flops <= 1.2 * share
    assert loss.shape == ()


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
    # The backward of slicing and selecting (e.g. rotary embeddings' halves).
    base, part, row = torch.zeros(3, 10), torch.randn(3, 4, generator=g), torch.randn(10)
    for op, args in (
        (aten.slice_scatter.default, (base, part, 1, 5, 9)),
        (aten.slice_scatter.default, (base, part[:, :2], -1, 0, 4, 2)),
        (aten.select_scatter.default, (base, row, 0, -1)),
    ):
        expected = op(*args)
        got = aten_to_jax.lower(op)(*(_to_jax(a) for a in args[:2]), *args[2:])
        np.testing.assert_array_equal(np.asarray(got), expected.numpy())


def test_an_op_the_lowering_lacks_fails_at_sync_naming_it():
    with xlasim.simulate(topology="2x2", accelerator="v5e", compiler="libtpu"):
        import torch_xla

        x = torch.ones(8).to(torch_xla.device())
        y = torch.logcumsumexp(x, 0)  # noqa: F841 - live: the sync computes it
        with pytest.raises(NotImplementedError, match=r"aten op aten\.logcumsumexp\.default"):
            torch_xla.sync()


def _mlp_step(fc1, fc2, opt, batch: torch.Tensor, mesh) -> None:
    """One training step of fc2(relu(fc1(x))) on ``batch`` split over the mesh's data axis."""
    import torch_xla
    import torch_xla.distributed.spmd as xs

    x = batch.to(torch_xla.device())
    xs.mark_sharding(x, mesh, ("data", None))
    fc2(torch.relu(fc1(x))).square().mean().backward()
    opt.step()
    opt.zero_grad()
    torch_xla.sync()


def _sharded_sgd_step(d: int, h: int, batch: int):
    """A sharded two-layer MLP + SGD step on v5e 2x4 (data 2 x model 4) with the compiler on;
    returns the figures of the graph its sync compiled."""
    with xlasim.simulate(topology="2x4", accelerator="v5e", compiler="libtpu"):
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
        opt = torch.optim.SGD([fc1.weight, fc1.bias, fc2.weight], lr=0.1)
        _mlp_step(fc1, fc2, opt, torch.randn(batch, d), mesh)
        (figures,) = xlasim.compiled_graphs()
        return figures


def test_sharded_training_step_figures_match_hand_counts():
    d, h, batch = 256, 1024, 64
    figures = _sharded_sgd_step(d, h, batch)
    f32 = 4
    params_per_chip = (h * d + h + h * d) * f32 // 4  # every parameter is split 4 ways
    x_per_chip = batch * d * f32 // 2
    assert figures.argument_bytes == params_per_chip + x_per_chip
    # SGD writes each parameter over its own buffer.
    assert figures.alias_bytes == params_per_chip
    assert figures.site.startswith(f"{__file__}:")
    matmul_flops = 2 * batch * d * h * 5 // 8  # forward 2, backward 3 (no gradient for x)
    assert matmul_flops <= figures.flops <= 1.2 * matmul_flops
    spec = parse_slice("2x4", "v5e")
    assert figures.hbm_bytes == spec.hbm_bytes_per_chip
    roofline = max(figures.flops / 197e12, figures.bytes_accessed / 819e9)
    assert figures.step_seconds == pytest.approx(roofline)


def _training_run(compiler: str | None) -> tuple[list[float], list[torch.Tensor]]:
    torch.manual_seed(0)
    with xlasim.simulate(topology="2x2", accelerator="v5e", compiler=compiler):
        import torch_xla
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        xr.use_spmd()
        torch_xla.manual_seed(0)
        mesh = xs.Mesh(np.arange(4), (4,), ("data",))
        dev = torch_xla.device()
        model = torch.nn.Sequential(
            torch.nn.Linear(32, 64), torch.nn.Dropout(0.1), torch.nn.GELU(), torch.nn.Linear(64, 8)
        ).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses = []
        for _ in range(3):
            x = torch.randn(16, 32).to(dev)
            xs.mark_sharding(x, mesh, ("data", None))
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            torch_xla.sync()
            losses.append(loss.item())
        return losses, [p.detach().cpu() for p in model.parameters()]


def test_numerics_are_the_same_with_the_compiler_on_and_off():
    losses_off, params_off = _training_run(None)
    losses_on, params_on = _training_run("libtpu")
    assert losses_on == losses_off
    for on, off in zip(params_on, params_off, strict=True):
        assert torch.equal(on, off)


def _dry_run_linear_step(topology: str, shard_bytes: int, width: int = 8192):
    """A dry-run SGD step of one Linear(width, rows) whose weight is split over every device
    so that each holds ``shard_bytes``; returns the compiled figures or the error."""
    with xlasim.simulate(topology=topology, accelerator="v5e", compiler="libtpu", dry_run=True):
        import torch_xla
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        xr.use_spmd()
        n = xr.global_runtime_device_count()
        rows = shard_bytes * n // (4 * width)
        mesh = xs.Mesh(np.arange(n), (n,), ("model",))
        dev = torch_xla.device()
        layer = torch.nn.Linear(width, rows, bias=False).to(dev)
        xs.mark_sharding(layer.weight, mesh, ("model", None))
        opt = torch.optim.SGD(layer.parameters(), lr=0.1)
        layer(torch.randn(16, width).to(dev)).square().mean().backward()
        opt.step()
        opt.zero_grad()
        try:
            torch_xla.sync()
        except ValueError as exc:
            # The graph stays pending after a failed compile, as on a TPU: a retry fails again.
            with pytest.raises(ValueError):
                torch_xla.sync()
            return exc
        return xlasim.compiled_graphs()[-1]


def test_fits_and_does_not_fit_as_the_real_compiler_says():
    # Weight shards of 7.5 and 8 GiB per v5e chip (16 GiB HBM, 15.75 GiB usable), far more
    # than this machine's RAM in total: a dry run. The step needs the weight and one more
    # buffer of its size (the compiler's copy for the matmul), so 7.5 fits and 8 does not.
    fits = _dry_run_linear_step("2x2", 15 * GIB // 2)
    assert not isinstance(fits, Exception), fits
    assert fits.argument_bytes >= 15 * GIB // 2
    assert 2 * 15 * GIB // 2 <= fits.peak_bytes <= fits.hbm_bytes

    error = _dry_run_linear_step("2x2", 8 * GIB)
    assert isinstance(error, ValueError)
    first, *rest = str(error).splitlines()
    # libtpu's own status message, without the status code torch_xla leaves out.
    assert first.startswith("Ran out of memory"), first
    assert "RESOURCE_EXHAUSTED" not in first
    text = "\n".join(rest)
    assert "does not fit v5litepod 2x2" in text
    assert f"{__file__}:" in text  # the user's line that cut the graph
    # The biggest buffer, mapped back to the program's tensor (8 GiB of f32 rows of 8192 on
    # each of 4 devices) and its sharding, whatever its place among the graph's inputs.
    rows = 8 * GIB * 4 // (4 * 8192)
    weight = f"shape [{rows}, 8192] float32 sharding {{devices=[4,1]0,1,2,3}}"
    assert re.search(rf"graph input \d+: {re.escape(weight)}", text), text

    # The same 8 GiB-per-device model over twice the devices is 4 GiB per device: it fits.
    assert not isinstance(_dry_run_linear_step("2x4", 4 * GIB), Exception)


def test_a_buffer_larger_than_hbm_is_named_and_materializing_raises_runtime_error():
    spec = parse_slice("2x2", "v5e")
    with xlasim.simulate(topology="2x2", accelerator="v5e", compiler="libtpu", dry_run=True):
        import torch_xla
        import torch_xla.runtime as xr

        xr.use_spmd()
        big = spec.hbm_bytes_per_chip * 5 // 4 // 4  # f32 elements: 1.25x one chip's HBM
        x = torch.empty(big).to(torch_xla.device())  # unannotated: replicated on every chip
        y = x * 2
        # .cpu() of a pending tensor compiles its graph: an aten op, so RuntimeError.
        with pytest.raises(RuntimeError, match=r"^Ran out of memory") as caught:
            y.sum().cpu()
    assert f"graph input 0: shape [{big}] float32 sharding {{replicated}}" in str(caught.value)


def test_xla_gives_the_optimizer_state_its_sharding():
    # AdamW's moments come out of the first step's graph; the simulator cannot derive their
    # sharding, the compiler can: the second step's arguments are then all sharded.
    d, h, batch = 256, 1024, 64
    with xlasim.simulate(topology="2x4", accelerator="v5e", compiler="libtpu"):
        import torch_xla
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        xr.use_spmd()
        mesh = xs.Mesh(np.arange(8), (2, 4), ("data", "model"))
        dev = torch_xla.device()
        fc1, fc2 = (
            torch.nn.Linear(d, h, bias=False).to(dev),
            torch.nn.Linear(h, d, bias=False).to(dev),
        )
        xs.mark_sharding(fc1.weight, mesh, ("model", None))
        xs.mark_sharding(fc2.weight, mesh, (None, "model"))
        opt = torch.optim.AdamW([fc1.weight, fc2.weight], lr=1e-3)
        for _ in range(2):
            _mlp_step(fc1, fc2, opt, torch.randn(batch, d), mesh)
        exp_avg = opt.state[fc1.weight]["exp_avg"]
        spec = torch_xla._XLAC._get_xla_sharding_spec(exp_avg)
        second = xlasim.compiled_graphs()[-1]
    assert spec == torch_xla._XLAC._get_xla_sharding_spec(fc1.weight)
    f32, params = 4, 2 * h * d
    # parameters and both moments split 4 ways, the batch 2 ways (the step count is on the CPU)
    assert second.argument_bytes == 3 * params * f32 // 4 + batch * d * f32 // 2


def test_mark_sharding_on_an_activation_constrains_the_compiled_graph():
    with xlasim.simulate(topology="2x4", accelerator="v5e", compiler="libtpu"):
        import torch_xla
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        xr.use_spmd()
        mesh = xs.Mesh(np.arange(8), (8,), ("model",))
        dev = torch_xla.device()
        x = torch.randn(64, 512).to(dev)
        w = torch.randn(512, 512).to(dev)
        h = x @ w
        xs.mark_sharding(h, mesh, (None, "model"))
        out = torch.relu(h) + 1
        graph = lc.replay([out])
        torch_xla.sync()
        spec = torch_xla._XLAC._get_xla_sharding_spec(out)
    targets = [n.target for n in graph.module.graph.nodes]
    assert targets.count(lc.CONSTRAIN) == 1
    assert [c.to_string() for c in graph.constraints] == ["{devices=[1,8]0,1,2,3,4,5,6,7}"]
    # XLA propagates the constraint through the elementwise ops to the output.
    assert spec == "{devices=[1,8]0,1,2,3,4,5,6,7}"


def test_a_multi_output_op_is_replayed_once():
    with xlasim.simulate(topology="2x4", accelerator="v5e", compiler="libtpu"):
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


def _python(code: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("XLASIM_", "TPU_"))}
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), environ.get("PYTHONPATH")]))
    environ["TMPDIR"] = str(tmp_path)
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_jax_is_imported_only_when_the_compiler_is_asked_for_and_logs_do_not_stay(tmp_path):
    code = """
        import sys, torch, xlasim
        with xlasim.simulate(topology="2x2", accelerator="v5e"):
            import torch_xla
            (torch.ones(4).to(torch_xla.device()) * 2).cpu()
        assert "jax" not in sys.modules, "jax imported without the compiler"
        with xlasim.simulate(topology="2x2", accelerator="v5e", compiler="libtpu"):
            import torch_xla
            (torch.ones(4).to(torch_xla.device()) * 2).cpu()
            assert len(xlasim.compiled_graphs()) == 1
        assert "jax" in sys.modules
    """
    result = _python(code, tmp_path)
    assert result.returncode == 0, result.stderr
    # libtpu wrote its logs under our own directory in $TMPDIR, removed at exit.
    assert list(tmp_path.iterdir()) == []


def test_xlasim_run_compiles_with_libtpu_and_prints_the_table(tmp_path):
    program = tmp_path / "train.py"
    program.write_text(
        textwrap.dedent(
            """
            import torch, torch_xla
            import torch_xla.runtime as xr
            xr.use_spmd()
            model = torch.nn.Linear(8, 8).to(torch_xla.device())
            model(torch.randn(4, 8).to(torch_xla.device())).sum().backward()
            torch_xla.sync()
            """
        )
    )
    command = [sys.executable, "-m", "xlasim", "run", "--topology", "2x2", "--accelerator", "v5e"]
    command += ["--compiler", "libtpu", "--dry-run", "--", sys.executable, str(program)]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("XLASIM_")}
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), environ.get("PYTHONPATH")]))
    result = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "xlasim: compiling graph" in result.stderr
    assert "Graphs compiled by libtpu for v5litepod 2x2" in result.stderr
    assert "train.py:7" in result.stderr  # the cut site, in the table


def test_pytest_option_attaches_the_compiler(tmp_path):
    (tmp_path / "test_it.py").write_text(
        textwrap.dedent(
            """
            import torch, xlasim

            def test_step(xlasim_sim):
                import torch_xla
                (torch.ones(4).to(torch_xla.device()) + 1).cpu()
                assert len(xlasim.compiled_graphs()) == 1
            """
        )
    )
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("XLASIM_", "PYTEST_"))}
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), environ.get("PYTHONPATH")]))
    environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    args = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "xlasim.pytest_plugin",
        "-p",
        "no:cacheprovider",
    ]
    result = subprocess.run(
        [*args, "--xlasim-compiler", "libtpu", "test_it.py"],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout


def test_the_llama_program_compiles_for_v5p_with_its_fsdp_sharding():
    # bench/dry_run_8b.py scaled down (2 layers, width 256), in a dry run: bfloat16 weights,
    # every matrix split over the 8 chips, the norms' vectors replicated; AdamW.
    dim, hidden, vocab, kv = 256, 512, 1024, 128
    matrices = 2 * vocab * dim + 2 * (2 * dim * dim + 2 * kv * dim + 3 * dim * hidden)
    vectors = 5 * dim  # two norms per layer and the final one
    params = (matrices // 8 + vectors) * 2  # bytes per chip
    spec = importlib.util.spec_from_file_location("dry_run_8b", ROOT / "bench" / "dry_run_8b.py")
    assert spec is not None and spec.loader is not None
    with xlasim.simulate(topology="2x2x2", accelerator="v5p", compiler="libtpu", dry_run=True):
        program = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(program)  # imports torch_xla: the simulator's, in here
        args = f"--layers 2 --dim {dim} --hidden {hidden} --heads 2 --kv-heads 1"
        program.main([*args.split(), "--vocab", str(vocab), "--seq", "64"])
        first, second = xlasim.compiled_graphs()
    # The first step updates the parameters in place and creates AdamW's two moments.
    assert first.alias_bytes == params
    assert first.output_bytes >= 3 * params
    # The second updates all three; the moments of the norms' vectors are sharded as the
    # compiler chose for the first step's outputs (replicated at most).
    low = 3 * params - 2 * 2 * vectors * 7 // 8
    assert low <= second.alias_bytes <= 3 * params
    # Besides the donated state: the token batch (int64) and the rotary and mask buffers.
    buffers = (64 * 64 + 2 * 64 * 128) * 2
    assert second.argument_bytes - second.alias_bytes >= buffers + 65 * 8
    assert second.peak_bytes < second.hbm_bytes
