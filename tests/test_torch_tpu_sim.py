"""The simulated TorchTPU: inside a simulation ``import torch_tpu`` gives the ``tpu`` device.

Expected facts come from TorchTPU 0.2.0's own Python sources (the ``torch-tpu==0.2.0`` wheel:
``torch_tpu/_loader.py``, ``_internal/public_api.py``, ``_internal/device/_device_module.py``,
``_internal/precision/precision.py``, ``_internal/utils/hardware.py``); values computed on the
``tpu`` device are compared with the same computation on eager CPU.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import xlasim

GiB = 1024**3

# Loading TorchTPU names PrivateUse1 "tpu" for the rest of the process (as the real loader
# does): the module's tests share one xdist worker, so the other one never sees that.
pytestmark = [
    pytest.mark.xdist_group("torch_tpu"),
    pytest.mark.skipif(
        torch.__version__ < "2.11",
        reason=f"TorchTPU 0.2.0 needs torch >= 2.11, this is {torch.__version__} "
        "(test_torch_tpu_torch_version.py checks the refusal)",
    ),
]


@pytest.fixture
def tpu() -> Iterator[Any]:
    """A simulated v6e 2x2 host with TorchTPU loaded (as ``import torch_tpu`` does)."""
    with xlasim.simulate("2x2") as runtime:
        import torch_tpu  # noqa: F401

        yield runtime


def test_tensors_live_on_the_tpu_device(tpu: Any) -> None:
    t = torch.ones(2, 3, device="tpu")
    assert t.device == torch.device("tpu", 0)
    assert t.is_tpu  # generated for the renamed PrivateUse1 backend, as TorchTPU's loader does
    assert torch.get_device_module("tpu") is torch.tpu
    assert torch.randn(4).to("tpu").device.type == "tpu"
    assert torch.nn.Linear(2, 2).to("tpu").weight.device.type == "tpu"
    assert torch.equal(t.cpu(), torch.ones(2, 3))


def test_elementwise_reductions_and_views_compute_as_on_cpu(tpu: Any) -> None:
    torch.manual_seed(0)
    x = torch.randn(6, 5)
    y = torch.randn(6, 5)
    cases = [
        lambda a, b: a + 2 * b,
        lambda a, b: torch.sin(a) * torch.exp(b),
        lambda a, b: a.sum(0),
        lambda a, b: a.mean(),
        lambda a, b: a.max(dim=1).values,
        lambda a, b: a.argmax(1),
        lambda a, b: torch.where(a > b, a, b),
        lambda a, b: a.T.contiguous()[1:, ::2],
        lambda a, b: torch.cat([a, b]).view(-1)[3:9],
        lambda a, b: torch.softmax(a, dim=-1),
        lambda a, b: (a > 0).sum(),
        lambda a, b: torch.cumsum(b, 0),
    ]
    for case in cases:
        expected = case(x, y)
        got = case(x.to("tpu"), y.to("tpu"))
        assert got.device.type == "tpu"
        assert got.dtype == expected.dtype
        assert torch.equal(got.cpu(), expected)
    assert x.to("tpu").sum().item() == x.sum().item()


F = torch.nn.functional

# Ops that reach the native fallback (or torch's generic kernels for a device) in different
# ways: indexing, data-dependent shapes, lists of results, factories, in-place metadata changes,
# out= tensors, dtype conversions. Each computes on tpu as on the CPU.
OPS: dict[str, Any] = {
    "index_select": lambda x, i, img: x.index_select(1, i),
    "gather": lambda x, i, img: x.gather(1, i.expand(4, 3)),
    "scatter_add_": lambda x, i, img: torch.zeros_like(x).scatter_add_(1, i.expand(4, 3), x),
    "index_put_": lambda x, i, img: x.clone().index_put_((i,), torch.tensor(1.0, device=x.device)),
    "boolean mask": lambda x, i, img: x[x > 0],
    "nonzero": lambda x, i, img: torch.nonzero(x > 0),
    "unique": lambda x, i, img: torch.unique(i, return_counts=True)[1],
    "sort": lambda x, i, img: x.sort(1).values,
    "topk": lambda x, i, img: x.topk(2).indices,
    "embedding": lambda x, i, img: F.embedding(i, x),
    "layer_norm": lambda x, i, img: F.layer_norm(x, (6,)),
    "max_pool2d": lambda x, i, img: F.max_pool2d(img, 2),
    "adaptive_avg_pool2d": lambda x, i, img: F.adaptive_avg_pool2d(img, 1),
    "cross_entropy": lambda x, i, img: F.cross_entropy(x[:3], i),
    "interpolate": lambda x, i, img: F.interpolate(img, scale_factor=2),
    "batch_norm": lambda x, i, img: F.batch_norm(img, None, None, training=True),
    "bfloat16": lambda x, i, img: (x.bfloat16() * 3).float(),
    "float64": lambda x, i, img: x.double().exp(),
    "int32": lambda x, i, img: (x * 10).int() // 3,
    "arange": lambda x, i, img: torch.arange(5, device=x.device),
    "full": lambda x, i, img: torch.full((2, 2), 3.0, device=x.device),
    "tensor(device=)": lambda x, i, img: torch.tensor([1.0, 2.0], device=x.device),
    "chunk": lambda x, i, img: torch.stack(x.chunk(2, 1)),
    "split": lambda x, i, img: x.split([2, 4], 1)[1],
    "masked_fill": lambda x, i, img: x.masked_fill(x < 0, 0),
    "clamp_": lambda x, i, img: x.clone().clamp_(min=0),
    "t_": lambda x, i, img: x.clone().t_(),
    "squeeze_": lambda x, i, img: x[:1].clone().squeeze_(0),
    "resize_": lambda x, i, img: x.clone().resize_(2, 3),
    "set_": lambda x, i, img: torch.empty(0, device=x.device).set_(x.clone()),
    "expand": lambda x, i, img: x[:1].expand(3, 6).contiguous(),
    "cumprod": lambda x, i, img: x.cumprod(1),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_op_computes_as_on_cpu(tpu: Any, name: str) -> None:
    torch.manual_seed(0)
    x, i, img = torch.randn(4, 6), torch.tensor([2, 0, 1]), torch.randn(2, 3, 8, 8)
    expected = OPS[name](x, i, img)
    got = OPS[name](x.to("tpu"), i.to("tpu"), img.to("tpu"))
    assert got.device.type == "tpu"
    assert got.dtype == expected.dtype
    # Equal up to float32 rounding: where torch has no device kernel but a generic one made of
    # other ops (layer_norm), its sums are ordered differently from the CPU kernel's.
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-6, atol=1e-6)


def test_conjugate_and_negative_views_copy_as_on_cpu(tpu: Any) -> None:
    z = torch.randn(3, dtype=torch.complex64)
    on_tpu = z.to("tpu")
    assert on_tpu.conj().is_conj()
    assert torch.equal(on_tpu.conj().cpu(), z.conj())
    assert torch.equal(on_tpu.conj().clone().cpu(), z.conj().clone())
    assert torch.equal((on_tpu.conj() * 2).cpu(), z.conj() * 2)
    assert torch.equal(on_tpu.conj().imag.cpu(), z.conj().imag)  # the negative bit
    assert torch.equal(on_tpu.conj().imag.to("tpu").cpu(), z.conj().imag)


def test_views_and_in_place_ops_share_memory(tpu: Any) -> None:
    t = torch.zeros(3, 4, device="tpu")
    row = t[1]
    row.add_(5)
    t.T[2].fill_(7)
    expected = torch.zeros(3, 4)
    expected[1] += 5
    expected.T[2].fill_(7)
    assert torch.equal(t.cpu(), expected)
    assert t.add_(1) is t  # an in-place op returns its own tensor


def test_arithmetic_mixes_devices_dtypes_and_autograd_as_on_cpu(tpu: Any) -> None:
    # add/sub/mul/div and mm have unboxed kernels of their own; expected values are the CPU's.
    a = torch.arange(6.0).reshape(2, 3)
    ints = torch.arange(3)
    on = a.to("tpu")
    assert torch.equal((on + ints.to("tpu")).cpu(), a + ints)  # type promotion, broadcasting
    assert torch.equal((on - torch.tensor(2.0)).cpu(), a - 2)  # a CPU scalar tensor
    assert torch.equal(torch.sub(on, on, alpha=3).cpu(), torch.sub(a, a, alpha=3))
    assert torch.equal((on / 4).cpu(), a / 4)
    assert torch.equal((ints.to("tpu") * 2).cpu(), ints * 2)
    assert torch.equal((on @ on.T).cpu(), a @ a.T)
    view = on[:, 1]
    assert view.mul_(10) is view
    assert view.add_(on[:, 0], alpha=2) is view
    expected = a.clone()
    expected[:, 1].mul_(10).add_(expected[:, 0], alpha=2)
    assert torch.equal(on.cpu(), expected)
    x = torch.tensor([1.0, 2.0], device="tpu", requires_grad=True)
    ((x * 2 + x) / x.detach().add(1)).sum().backward()
    assert x.grad is not None and x.grad.device.type == "tpu"
    assert torch.equal(x.grad.cpu(), torch.tensor([1.5, 1.0]))


def test_arithmetic_with_a_cpu_tensor_raises_as_torch_does(tpu: Any) -> None:
    # torch's rule (its TensorIterator check; the same on CUDA): a CPU tensor other than a
    # 0-dim scalar cannot join a device tensor's op.
    on = torch.ones(2, device="tpu")
    same = r"^Expected all tensors to be on the same device, but found at least two devices, "
    with pytest.raises(RuntimeError, match=same + r"tpu:0 and cpu!$"):
        on + torch.ones(2)
    with pytest.raises(RuntimeError, match=same + r"cpu and tpu:0!$"):
        torch.ones(2).mul(on.sum())  # a 0-dim tpu tensor is no CPU scalar
    with pytest.raises(RuntimeError, match=same + r"tpu:0 and cpu!"):
        on.add_(torch.ones(2))
    with pytest.raises(RuntimeError, match=same + r"tpu:0 and cpu!"):
        torch.ones(2, 2, device="tpu") @ torch.ones(2, 2)
    assert torch.equal((on * torch.tensor(3.0)).cpu(), torch.full((2,), 3.0))


def test_set_shares_the_other_tensors_memory(tpu: Any) -> None:
    target = torch.zeros(2, device="tpu")
    source = torch.arange(4.0, device="tpu")
    target.set_(source)
    source.add_(1)
    assert torch.equal(target.cpu(), torch.arange(4.0) + 1)
    del source  # target keeps the memory alive
    assert torch.equal((target * 1).cpu(), torch.arange(4.0) + 1)


def test_out_tensors_are_resized(tpu: Any) -> None:
    out = torch.empty(0, device="tpu")
    a = torch.arange(6.0).reshape(2, 3)
    torch.add(a.to("tpu"), 1, out=out)
    assert out.shape == (2, 3)
    assert torch.equal(out.cpu(), a + 1)


def test_training_an_mlp_equals_eager_cpu_at_highest_precision(tpu: Any) -> None:
    torch.set_float32_matmul_precision("highest")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    on_tpu = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    on_tpu.load_state_dict(model.state_dict())
    on_tpu.to("tpu")
    data = torch.randn(32, 8)
    target = torch.randn(32, 1)
    cpu_opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tpu_opt = torch.optim.SGD(on_tpu.parameters(), lr=0.1)
    for _ in range(5):
        for net, opt, x, y in (
            (model, cpu_opt, data, target),
            (on_tpu, tpu_opt, data.to("tpu"), target.to("tpu")),
        ):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(net(x), y)
            loss.backward()
            opt.step()
        torch.testing.assert_close(on_tpu[0].weight.grad.cpu(), model[0].weight.grad)
    assert on_tpu[0].weight.grad.device.type == "tpu"
    for p, q in zip(on_tpu.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(p.detach().cpu(), q.detach())


def test_matmul_precision_maps_to_the_tpu_precision(tpu: Any) -> None:
    # TorchTPU's loader: medium <-> DEFAULT, high <-> HIGH, highest <-> HIGHEST; its default
    # is DEFAULT ("On TPU, float32 matrix multiplications are natively executed in bfloat16").
    assert torch.get_float32_matmul_precision() == "medium"
    torch.manual_seed(0)
    a, b = torch.randn(16, 32), torch.randn(32, 8)
    one_pass = a.bfloat16().float() @ b.bfloat16().float()
    assert torch.equal((a.to("tpu") @ b.to("tpu")).cpu(), one_pass)
    with torch.tpu.precision(torch.tpu.Precision.HIGHEST):
        close = (a.to("tpu") @ b.to("tpu")).cpu()
    torch.testing.assert_close(close, a @ b)
    assert not torch.equal(close, one_pass)
    torch.set_float32_matmul_precision("high")
    assert torch.get_float32_matmul_precision() == "high"
    assert tpu.mat_mul_precision == "high"  # one runtime precision under both surfaces
    with pytest.raises(
        ValueError, match="expected to be one of 'highest', 'high', or 'medium', got 'low'"
    ):
        torch.set_float32_matmul_precision("low")
    refused = pytest.raises(ValueError, match="expected to be one of 'PrecisionConfig.DEFAULT'")
    with refused, torch.tpu.precision("highest"):  # type: ignore[arg-type]
        pass
    # Integers and float64 compute as on the CPU.
    ints = torch.arange(12).reshape(3, 4)
    assert torch.equal((ints.to("tpu") @ ints.T.to("tpu")).cpu(), ints @ ints.T)


def test_exact_numerics_compute_tpu_matmuls_as_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    # XLASIM_NUMERICS=exact (the project's switch) trades the TPU's precision for the CPU's
    # kernels; the next TorchTPU simulation in the same process emulates again.
    torch.manual_seed(0)
    a, b = torch.randn(16, 32), torch.randn(32, 8)
    monkeypatch.setenv("XLASIM_NUMERICS", "exact")
    with xlasim.simulate("2x2"):
        import torch_tpu  # noqa: F401

        assert torch.get_float32_matmul_precision() == "medium"
        assert torch.equal((a.to("tpu") @ b.to("tpu")).cpu(), a @ b)
        assert torch.equal(torch.mm(a.to("tpu"), b.to("tpu")).cpu(), torch.mm(a, b))
    monkeypatch.delenv("XLASIM_NUMERICS")
    with xlasim.simulate("2x2"):
        import torch_tpu  # noqa: F401, F811

        one_pass = a.bfloat16().float() @ b.bfloat16().float()
        assert torch.equal((a.to("tpu") @ b.to("tpu")).cpu(), one_pass)


def test_one_device_per_process(tpu: Any) -> None:
    assert torch.tpu.device_count() == 1
    assert torch.tpu.is_available()
    assert torch.tpu.is_initialized()
    assert torch.tpu.current_device() == 0
    torch.tpu.set_device(0)
    torch.tpu.set_device("tpu")
    torch.tpu.set_device(torch.device("tpu:0"))
    torch.tpu.synchronize()
    with torch.tpu.device(0):
        pass
    with pytest.raises(
        ValueError,
        match=(
            "Cannot set TPU device to index 1, current process is bound to device index 0. "
            "Changing the active TPU device within a process is not supported."
        ),
    ):
        torch.tpu.set_device(1)
    with pytest.raises(ValueError, match="Invalid device string cuda"):
        torch.tpu.set_device("cuda")
    with pytest.raises(ValueError, match="Invalid device type cpu"):
        torch.tpu.set_device(torch.device("cpu"))
    with pytest.raises(RuntimeError, match="tpu:1 is not a TPU device of this process"):
        torch.empty(2, device="tpu:1")


@pytest.mark.parametrize(
    ("topology", "accelerator", "name"),
    [("2x2", "v6e", "TPU v6e"), ("2x2", "v5litepod", "TPU v5e"), ("2x2x1", "v4", "TPU v4")],
)
def test_device_name_and_memory_follow_the_generation(
    topology: str, accelerator: str, name: str
) -> None:
    with xlasim.simulate(topology, accelerator) as runtime:
        import torch_tpu  # noqa: F401

        assert torch.tpu.get_device_name() == name
        props = torch.tpu.get_device_properties()
        assert props.name == name
        assert props.total_memory == runtime.spec.hbm_bytes_per_chip
    assert {"v6e": 32, "v5litepod": 16, "v4": 32}[accelerator] * GiB == props.total_memory


def test_memory_statistics_and_the_chips_hbm(tpu: Any) -> None:
    # PyTorch's device-allocator queries; the total is the simulated chip's HBM.
    torch.accelerator.reset_peak_memory_stats()
    before = torch.accelerator.memory_allocated()
    t = torch.empty(1024, 1024, device="tpu")  # 4 MiB
    u = (t[:512] * 2).contiguous()  # a fresh result taken over from the CPU kernel: 2 MiB
    assert torch.accelerator.memory_allocated() - before == 6 * 2**20
    free, total = torch.accelerator.get_memory_info()
    assert total == tpu.spec.hbm_bytes_per_chip == 32 * GiB
    assert free == total - torch.accelerator.memory_reserved()
    del t, u
    assert torch.accelerator.memory_allocated() == before
    assert torch.accelerator.max_memory_allocated() >= before + 6 * 2**20


def test_hbm_overflow_fails_like_pjrt_when_enforced(tpu: Any) -> None:
    # A v6e chip has 32 GiB of HBM: with enforcement on (xlasim.enforce_hbm, as for the xla
    # device), a tensor that does not fit fails before taking host memory.
    xlasim.enforce_hbm()
    with pytest.raises(
        torch.OutOfMemoryError,
        match=(
            r"RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to allocate "
            r"40\.00G\. That was not possible\. There are 3[12]\.\d\dG free\."
        ),
    ):
        torch.empty(10 * GiB, dtype=torch.float32, device="tpu")
    small = torch.ones(4, device="tpu")  # what fits is unaffected
    xlasim.enforce_hbm(False)
    assert small.sum().item() == 4


def test_rng_is_per_device_and_seedable(tpu: Any) -> None:
    torch.tpu.manual_seed(3)
    first = torch.randn(5, device="tpu").cpu()
    torch.tpu.manual_seed(3)
    assert torch.equal(torch.randn(5, device="tpu").cpu(), first)
    assert torch.tpu.initial_seed() == 3
    cpu_state = torch.get_rng_state()
    state = torch.tpu.get_rng_state()
    drawn = torch.rand(4, device="tpu").cpu()
    assert torch.equal(torch.get_rng_state(), cpu_state)  # the CPU's stream is untouched
    torch.tpu.set_rng_state(state)
    assert torch.equal(torch.rand(4, device="tpu").cpu(), drawn)
    generator = torch.tpu.default_generators[0]
    assert generator.device == torch.device("tpu", 0)
    with pytest.raises(ValueError, match="expected local device index 0, got 1"):
        torch.tpu.get_rng_state(1)
    torch.manual_seed(11)  # seeds every device, as torch.manual_seed does
    assert torch.tpu.initial_seed() == 11


def test_streams_and_events_of_an_eager_device(tpu: Any) -> None:
    # TorchTPU keeps one implicit stream per device; its streams carry ids, its events complete
    # once the work pending at record() has; on the eager simulated device, at once.
    default = torch.tpu.default_stream()
    assert isinstance(default, torch.Stream) and default.stream_id == 0
    assert default.device == torch.device("tpu", 0)
    side = torch.tpu.Stream()
    assert side.stream_id != 0 and repr(side) == "<torch.tpu.TpuStream>"
    with torch.tpu.stream(side):
        assert torch.tpu.current_stream().stream_id == side.stream_id
        start = torch.tpu.Event(enable_timing=True).record()
        torch.ones(64, 64, device="tpu").sum()
        end = side.record_event(torch.tpu.Event(enable_timing=True))
    assert torch.tpu.current_stream().stream_id == 0
    end.synchronize()
    assert end.query()
    assert start.elapsed_time(end) >= 0.0
    side.wait_stream(default)
    side.synchronize()
    torch.tpu.set_stream(side)
    assert torch.tpu.current_stream().stream_id == side.stream_id
    torch.tpu.set_stream(default)
    message = "Streams and Events are not fully implemented in TorchTPU"  # TorchTPU's own
    with pytest.raises(NotImplementedError, match=message):
        side.query()
    with pytest.raises(NotImplementedError, match=message):
        end.ipc_handle()


def test_torch_compile_uses_the_tpu_backend_for_tpu_inputs(tpu: Any) -> None:
    # TorchTPU's loader: torch.compile without a backend compiles graphs with tpu inputs with
    # its "tpu" backend (dynamic=False); Inductor refuses tpu inputs with its message.
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()).to("tpu")
    x = torch.randn(4, 8, device="tpu")
    compiled = torch.compile(model)
    torch.testing.assert_close(compiled(x).cpu(), model(x).cpu())
    assert "tpu" in torch._dynamo.list_backends()
    with pytest.raises(Exception, match=r"torch\.compile\(\.\.\., backend='inductor'\) on TPU"):
        torch.compile(model, backend="inductor")(x)
    torch._dynamo.reset()


def test_torch_compile_recompilations_are_reported(tpu: Any) -> None:
    # TorchTPU compiles with dynamic=False (its loader), so under dynamo's own rules a new
    # input shape at the same call is a new graph; the same shape again reuses the first.
    torch._dynamo.reset()
    model = torch.nn.Linear(8, 8).to("tpu")
    compiled = torch.compile(model)

    def step(rows: int) -> torch.Tensor:
        return compiled(torch.randn(rows, 8, device="tpu"))  # the call site

    xlasim.clear_recompilations()
    with xlasim.assert_no_recompilation(allowed=1) as watch:
        for rows in (4, 4, 3):
            out = step(rows)
    assert out.shape == (3, 8)
    (report,) = watch.reports
    call_line = next(
        i
        for i, line in enumerate(Path(__file__).read_text().splitlines(), 1)
        if line.endswith("# the call site")
    )
    assert (report.filename, report.lineno) == (__file__, call_line)
    assert report.function == "step"
    changes = [(c.before.shape, c.after.shape) for c in report.changed_inputs if c.before]
    assert ((4, 8), (3, 8)) in changes, report.reasons
    text = xlasim.recompilation_report()
    assert text.startswith("1 recompilation(s) at 1 site(s), 2 graph(s) compiled in all:"), text
    with (
        pytest.raises(xlasim.RecompilationError, match="expected no recompilation, got 1"),
        xlasim.assert_no_recompilation(),
    ):
        step(2)
    torch._dynamo.reset()


def test_autocast_on_tpu_runs_matmuls_in_bfloat16_and_softmax_in_float32(tpu: Any) -> None:
    # The default dtype is TorchTPU's (its device module's _autocast_dtype, bfloat16); the
    # policy is the TPU one torch_xla 2.9 registers (TorchTPU's own list is in its C++ library).
    assert torch.get_autocast_dtype("tpu") == torch.bfloat16
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    ta, tb = a.to("tpu"), b.to("tpu")
    linear = torch.nn.Linear(8, 8).to("tpu")
    with torch.autocast("tpu"):
        product = ta @ tb
        soft = torch.softmax(product, -1)
        total = ta + tb
        out = linear(ta)
    assert (product.dtype, soft.dtype, total.dtype, out.dtype) == (
        torch.bfloat16,
        torch.float32,
        torch.float32,
        torch.bfloat16,
    )
    # the product is the bfloat16 matmul's, as autocast on eager CPU computes it
    torch.testing.assert_close(product.cpu(), a.bfloat16() @ b.bfloat16())
    out.float().sum().backward()
    assert linear.weight.grad is not None and linear.weight.grad.dtype == torch.float32
    # outside the block, float32 again
    assert (ta @ tb).dtype == torch.float32


def test_tpu_tensors_count_on_the_chip_the_process_drives(
    tpu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One chip per process (TorchTPU binds one); a 1 MiB tensor is on it, in chip_memory()
    before = [row["bytes"] for row in xlasim.chip_memory()]
    x = torch.zeros(1024, 256, device="tpu")
    after = [row["bytes"] for row in xlasim.chip_memory()]
    assert [b - a for a, b in zip(before, after, strict=True)] == [2**20, 0, 0, 0]
    monkeypatch.setenv("TPU_VISIBLE_CHIPS", "2")  # Ray's one chip for a worker
    moved = [row["bytes"] - b for row, b in zip(xlasim.chip_memory(), before, strict=True)]
    assert moved == [0, 0, 2**20, 0]
    del x
    assert [row["bytes"] for row in xlasim.chip_memory()] == before


def test_what_is_not_simulated_says_so(tpu: Any) -> None:
    with pytest.raises(NotImplementedError, match=r"torch\.tpu\.set_eager_mode is not simulated"):
        torch.tpu.set_eager_mode(None)
    with pytest.raises(NotImplementedError, match=r"torch\.tpu\.eager_mode is not simulated"):
        _ = torch.tpu.eager_mode
    with pytest.raises(NotImplementedError, match=r"torch\.tpu\.ops\.splash_sdpa is not simulated"):
        torch.tpu.ops.splash_sdpa()
    import torch.tpu.distributed as tpu_distributed

    with pytest.raises(NotImplementedError, match="window_num_stripes is not simulated"):
        _ = tpu_distributed.window_num_stripes
    with pytest.raises(NotImplementedError, match="spmd_safe is not simulated"):
        tpu_distributed.spmd_safe()
    assert "tpu_dist" in torch.distributed.Backend.backend_list


def test_every_public_name_is_present(tpu: Any) -> None:
    import torch_tpu._internal.public_api as public_api

    names = public_api.public_names()
    # TorchTPU 0.2.0 (_internal/public_api.py): torch.tpu exports 30 names, its six public
    # modules 41 more.
    assert {k: len(v) for k, v in names.items()}["torch.tpu"] == 30
    assert sum(len(v) for v in names.values()) == 71
    for module, exported in names.items():
        target = torch.tpu if module == "torch.tpu" else getattr(torch.tpu, module.split(".")[2])
        for name in exported:
            assert name in target.__all__, f"{module}.{name}"


def test_distribution_version(tpu: Any) -> None:
    assert importlib.metadata.version("torch-tpu") == "0.2.0"


def test_outside_a_simulation_there_is_no_tpu() -> None:
    with xlasim.simulate("2x2"):
        import torch_tpu

        t = torch.ones(2, device="tpu")
    # As the real wheel on a machine without TPUs: nothing loads, no device is counted.
    assert torch.tpu.device_count() == 0
    assert not torch.tpu.is_available()
    torch_tpu._loader._LOADED = False
    torch_tpu._loader.load()
    assert not torch_tpu._loader._LOADED
    with pytest.raises(RuntimeError, match="no simulated TPU is attached"):
        torch.empty(1, device="tpu")
    del t


def test_environment_activation_loads_torch_tpu_in_a_fresh_process() -> None:
    # XLASIM_TOPOLOGY makes a process start simulated; its first `import torch_tpu` activates
    # the simulation, as `import torch_xla` does. A backward pass on the tpu device, then a
    # clean exit (autograd's device threads are drained first).
    program = (
        "import torch, torch_tpu\n"
        "x = torch.ones(3, device='tpu', requires_grad=True)\n"
        "(x * 2).sum().backward()\n"
        "print(torch.tpu.get_device_name(), x.grad.device, x.grad.sum().item())\n"
    )
    env = {**os.environ, "XLASIM_TOPOLOGY": "2x2", "XLASIM_ACCELERATOR": "v5litepod"}
    done = subprocess.run(
        [sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "TPU v5e tpu:0 6.0"


def test_a_process_with_another_privateuse1_backend_is_refused() -> None:
    # PyTorch names PrivateUse1 once per process: where another backend (the real TorchTPU
    # included) has named it, the simulated one cannot load, and says why.
    program = (
        "import torch, xlasim\n"
        "torch.utils.rename_privateuse1_backend('tpu')\n"
        "with xlasim.simulate('2x2'):\n"
        "    try:\n"
        "        import torch_tpu\n"
        "    except RuntimeError as exc:\n"
        "        print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "PrivateUse1 device is already named 'tpu'" in done.stdout


def test_seeding_after_a_torch_tpu_simulation_needs_no_tpu() -> None:
    """torch.manual_seed also seeds the renamed PrivateUse1 device's module, for the rest of the
    process: in a later simulation that never loads TorchTPU there is no tpu device to seed
    (nor one to report), and seeding the CPU still works."""
    with xlasim.simulate("2x2"):
        import torch_tpu  # noqa: F401

        torch.manual_seed(0)
        first = torch.randn(3, device="tpu").cpu()
        torch.manual_seed(0)
        assert torch.equal(torch.randn(3, device="tpu").cpu(), first)
    with xlasim.simulate("2x2x1", "v4"):
        import torch_xla

        torch.manual_seed(5)
        on_cpu = torch.randn(3)
        torch.manual_seed(5)
        assert torch.equal(torch.randn(3), on_cpu)
        assert torch_xla.device().type == "xla"
        # No tpu device here (torch.distributed.checkpoint picks its loader by this).
        assert torch.tpu.device_count() == 0 and not torch.tpu.is_available()


def test_the_device_is_the_chip_tpu_visible_chips_names(
    tpu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ray gives a worker holding {"TPU": 1} one chip through TPU_VISIBLE_CHIPS (Ray 2.60's
    # TPUAcceleratorManager); the process's one device is that chip.
    import torch_tpu._internal.utils.hardware as hardware

    monkeypatch.delenv("TPU_VISIBLE_CHIPS", raising=False)
    assert hardware.bound_chip() == 0
    monkeypatch.setenv("TPU_VISIBLE_CHIPS", "3")
    assert hardware.bound_chip() == 3
    monkeypatch.setenv("TPU_VISIBLE_CHIPS", "4")
    with pytest.raises(ValueError, match=r"a host of v6e-4 has chips 0\.\.3"):
        hardware.bound_chip()


def test_the_first_process_group_spans_world_size(
    tpu: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # TorchTPU 0.2.0's ProcessGroupTpu (its C++ runtime's message): the first group of a
    # process covers the WORLD_SIZE processes the launcher started.
    import torch.distributed as dist

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(
        RuntimeError, match=r"must be of size WORLD_SIZE \(expected size 2, got 1\)"
    ):
        dist.init_process_group("tpu_dist", store=dist.HashStore(), rank=0, world_size=1)
    monkeypatch.setenv("WORLD_SIZE", "1")
    dist.init_process_group("tpu_dist", store=dist.HashStore(), rank=0, world_size=1)
    try:
        t = torch.arange(3.0, device="tpu")
        dist.all_reduce(t)
        assert t.device.type == "tpu" and dist.get_backend() == "tpu_dist"
        torch.testing.assert_close(t.cpu(), torch.arange(3.0))
    finally:
        dist.destroy_process_group()
