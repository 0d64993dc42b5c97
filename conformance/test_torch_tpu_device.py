"""TorchTPU's ``tpu`` device, the same tests on the simulated TorchTPU and on real TorchTPU.

Each test runs on every ``torch_tpu_target``: ``sim`` in this process (torch >= 2.11) and
``torch_tpu`` on a TPU VM with the real package. The facts come from TorchTPU 0.2.0's Python
sources (``torch_tpu/_loader.py``: PrivateUse1 named ``tpu``, ``torch.set_float32_matmul_
precision`` mapped to the TPU's precision, ``torch.compile``'s ``"tpu"`` backend;
``_internal/device/_device_module.py``: one device per process, RNG per device, the device's
memory) and from the TPU's matrix unit (float32 operands rounded to bfloat16 at DEFAULT
precision, products accumulated in float32); values are compared with eager CPU.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture
def matmul_precision() -> Iterator[None]:
    """Each test sets the precision it checks; torch's global setting is put back after."""
    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)


def test_one_tpu_device_per_process(torch_tpu_target):
    assert torch.tpu.is_available() and torch.tpu.device_count() == 1
    x = torch.arange(6.0, device="tpu")
    assert x.device == torch.device("tpu", 0)
    assert "TPU" in torch.tpu.get_device_name()


def test_elementwise_ops_reductions_and_views_equal_eager_cpu(torch_tpu_target):
    torch.manual_seed(0)
    a = torch.randn(6, 5)
    t = a.to("tpu")
    for fn in (
        lambda x: (x * 2 + 1).tanh(),
        lambda x: x.sum(dim=0),
        lambda x: x.t()[1:4].contiguous(),
        lambda x: torch.softmax(x, dim=-1),
        lambda x: x.max(dim=1).values,
    ):
        torch.testing.assert_close(fn(t).cpu(), fn(a))
    t.add_(1)  # in place on the device
    torch.testing.assert_close(t.cpu(), a + 1)


def test_highest_precision_matmul_equals_cpu_float32(torch_tpu_target, matmul_precision):
    torch.set_float32_matmul_precision("highest")
    torch.manual_seed(0)
    a, b = torch.randn(64, 128), torch.randn(128, 32)
    torch.testing.assert_close((a.to("tpu") @ b.to("tpu")).cpu(), a @ b, rtol=1e-5, atol=1e-5)


def test_medium_precision_is_the_tpus_default_bfloat16_pass(torch_tpu_target, matmul_precision):
    # TorchTPU maps 'medium' to the TPU's DEFAULT precision: operands rounded to bfloat16.
    torch.set_float32_matmul_precision("medium")
    torch.manual_seed(0)
    a, b = torch.randn(64, 128), torch.randn(128, 32)
    got = (a.to("tpu") @ b.to("tpu")).cpu()
    rounded = a.bfloat16().float() @ b.bfloat16().float()
    torch.testing.assert_close(got, rounded, rtol=1e-5, atol=1e-4)
    assert (got - a @ b).abs().max() > 1e-3  # visibly not float32's product


def test_random_numbers_are_per_device_and_seedable(torch_tpu_target):
    torch.tpu.manual_seed(7)
    first = torch.rand(5, device="tpu").cpu()
    torch.tpu.manual_seed(7)
    assert torch.equal(torch.rand(5, device="tpu").cpu(), first)
    # the CPU generator is another one: drawing there leaves the device's sequence alone
    torch.tpu.manual_seed(7)
    torch.rand(5)
    assert torch.equal(torch.rand(5, device="tpu").cpu(), first)


def test_training_steps_equal_eager_cpu(torch_tpu_target, matmul_precision):
    torch.set_float32_matmul_precision("highest")
    losses = {}
    for device in ("cpu", "tpu"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
        model.to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        g = torch.Generator().manual_seed(1)
        x, y = torch.randn(32, 8, generator=g), torch.randn(32, 1, generator=g)
        x, y = x.to(device), y.to(device)
        losses[device] = []
        for _ in range(3):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            losses[device].append(loss.item())
    assert losses["tpu"] == pytest.approx(losses["cpu"], rel=1e-5)


def test_torch_compile_computes_what_eager_computes(torch_tpu_target, matmul_precision):
    torch.set_float32_matmul_precision("highest")
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()).to("tpu")
    x = torch.randn(4, 8, device="tpu")
    torch.testing.assert_close(torch.compile(model)(x).cpu(), model(x).cpu())
    torch._dynamo.reset()


def test_autocast_runs_matmuls_in_bfloat16(torch_tpu_target):
    a = torch.randn(8, 8, device="tpu")
    with torch.autocast("tpu", dtype=torch.bfloat16):
        assert (a @ a).dtype == torch.bfloat16
        assert torch.nn.functional.linear(a, a).dtype == torch.bfloat16
    assert (a @ a).dtype == torch.float32


def test_allocator_counts_the_devices_tensors(torch_tpu_target):
    # torch's device-allocator statistics, which TorchTPU's allocator keeps
    before = torch.accelerator.memory_allocated()
    x = torch.empty(1024, 1024, device="tpu")  # 4 MiB
    assert torch.accelerator.memory_allocated() - before >= 4 * 2**20
    del x
    assert torch.accelerator.memory_allocated() == before
    assert torch.tpu.get_device_properties().total_memory > 4 * 2**30
