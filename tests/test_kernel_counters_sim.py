"""torch_xla's per-kernel ``xla::<op>`` counters: which ops count, under which name, how often.

Every expected value was measured on real torch_xla 2.9 on CPU (``PJRT_DEVICE=CPU``, one
device), each case after ``met.clear_all()`` on tensors already on the device and synced."""

from __future__ import annotations

import pytest
import torch


def _kernel_counts(run) -> dict[str, int]:
    import torch_xla.debug.metrics as met

    met.clear_all()
    run()
    return {n: met.counter_value(n) for n in met.counter_names() if n.startswith("xla::")}


CASES = {
    "add": (lambda a, b, d: a + b, {"xla::add": 1}),
    "add_scalar": (lambda a, b, d: a + 2, {"xla::add": 1}),
    "add_": (lambda a, b, d: a.add_(b), {"xla::add": 1, "xla::_propagate_xla_data": 1}),
    "mul_": (lambda a, b, d: a.mul_(5), {"xla::mul": 1, "xla::_propagate_xla_data": 1}),
    "relu_": (lambda a, b, d: torch.relu_(a), {"xla::relu": 1, "xla::_propagate_xla_data": 1}),
    "t": (lambda a, b, d: a.t(), {"xla::t_copy": 1}),
    "view": (lambda a, b, d: a.view(16), {"xla::view_copy_symint": 1}),
    "select": (lambda a, b, d: a[1], {"xla::select_copy": 1}),
    "expand": (
        lambda a, b, d: a[0].expand(3, 4),
        {"xla::select_copy": 1, "xla::expand_copy_symint": 1},
    ),
    "sum": (lambda a, b, d: a.sum(), {"xla::sum": 1}),
    "mm": (lambda a, b, d: a @ b, {"xla::mm": 1}),
    "linear": (
        lambda a, b, d: torch.nn.functional.linear(a, b),
        {"xla::t_copy": 1, "xla::mm": 1},
    ),
    "softmax": (lambda a, b, d: torch.softmax(a, 0), {"xla::_softmax": 1}),
    "logsumexp": (lambda a, b, d: torch.logsumexp(a, 0), {"xla::logsumexp": 1}),
    "clone": (lambda a, b, d: a.clone(), {"xla::clone": 1}),
    "svd": (lambda a, b, d: torch.svd(a), {"xla::_linalg_svd": 1, "xla::transpose_copy": 1}),
    "empty": (lambda a, b, d: torch.empty(3, device=d), {"xla::empty_symint": 1}),
    "randn": (
        lambda a, b, d: torch.randn(3, 3, device=d),
        {
            "xla::empty_symint": 1,
            "xla::clone": 1,
            "xla::normal_": 1,
            "xla::_propagate_xla_data": 1,
        },
    ),
    "zeros": (
        lambda a, b, d: torch.zeros(3, device=d),
        {"xla::empty_symint": 1, "xla::clone": 1, "xla::zero_": 1, "xla::_propagate_xla_data": 1},
    ),
    "copy_between_devices": (
        lambda a, b, d: a.copy_(b),
        {"xla::copy": 1, "xla::_copy_from": 1, "xla::_propagate_xla_data": 1},
    ),
    "copy_to_host": (
        lambda a, b, d: torch.empty(4, 4).copy_(a),
        {"xla::copy_": 1, "xla::_copy_from": 1},
    ),
    "cpu": (lambda a, b, d: a.cpu(), {"xla::_to_copy": 1}),
    "to_dtype": (lambda a, b, d: a.to(torch.bfloat16), {"xla::_to_copy": 1}),
}


@pytest.mark.topology("2x2x1", accelerator="v4")
@pytest.mark.parametrize("case", sorted(CASES))
def test_kernel_counters_as_torch_xla_counts_them(xlasim_sim, case):
    import torch_xla

    run, expected = CASES[case]
    d = torch_xla.device()
    a = torch.randn(4, 4).to(d)
    b = torch.randn(4, 4).to(d)
    torch_xla.sync()
    assert _kernel_counts(lambda: run(a, b, d)) == expected


@pytest.mark.topology("2x2x1", accelerator="v4")
def test_batch_norm_counts_its_kernel_once(xlasim_sim):
    # Real torch_xla 2.9: a BatchNorm2d forward in training counts native_batch_norm once, the
    # add_ of num_batches_tracked as add (functionalized) and the empty behind its 1.
    import torch_xla

    d = torch_xla.device()
    m = torch.nn.BatchNorm2d(16).to(d)
    x = torch.randn(8, 16, 8, 32).to(d)
    torch_xla.sync()
    assert _kernel_counts(lambda: m(x)) == {
        "xla::native_batch_norm": 1,
        "xla::add": 1,
        "xla::_propagate_xla_data": 1,
        "xla::empty_symint": 1,
    }


@pytest.mark.topology("2x2x1", accelerator="v4")
def test_reading_a_scalar_counts_the_fallback_and_its_transfer(xlasim_sim):
    # Real torch_xla 2.9: .item() runs _local_scalar_dense on its CPU fallback after _to_cpu.
    import torch_xla
    import torch_xla.debug.metrics as met

    d = torch_xla.device()
    a = torch.randn(4).to(d)
    torch_xla.sync()
    met.clear_all()
    a.sum().item()
    assert met.counter_value("xla::_to_cpu") == 1
    assert met.counter_value("aten::_local_scalar_dense") == 1
    assert met.counter_value("xla::_local_scalar_dense") is None


@pytest.mark.topology("2x2x1", accelerator="v4")
def test_clear_counters_drops_kernel_counters(xlasim_sim):
    # Real torch_xla 2.9: clear_counters() removes xla::add from the names and the report.
    import torch_xla
    import torch_xla.debug.metrics as met

    d = torch_xla.device()
    a = torch.ones(2, device=d)
    _ = a + a
    assert "xla::add" in met.metrics_report()
    met.clear_counters()
    assert met.counter_value("xla::add") is None
    assert "xla::add" not in met.metrics_report()


def test_a_compiled_program_runs_without_its_kernels():
    # torch_xla 2.9 on CPU: the first call traces the graph (xla::add, xla::cos among the
    # counters); later calls run the compiled program, counting no kernel, and each records
    # one RunCachedGraphInputData and RunCachedGraphOutputData sample.
    import xlasim

    with xlasim.simulate("2x2"):
        import torch_xla
        import torch_xla.debug.metrics as met

        dev = torch_xla.device()
        x, y = torch.rand(3).to(dev), torch.rand(3).to(dev)
        torch_xla.sync()
        f = torch.compile(lambda a, b: torch.cos(a) + b, backend="openxla")
        met.clear_all()
        f(x, y)
        kernels = {n for n in met.counter_names() if n.startswith("xla::")}
        assert {"xla::add", "xla::cos"} <= kernels
        met.clear_all()
        f(x, y)
        out = f(x, y)
        assert [n for n in met.counter_names() if n.startswith("xla::")] == []
        assert met.metric_data("RunCachedGraphInputData")[0] == 2
        assert met.metric_data("RunCachedGraphOutputData")[0] == 2
        assert torch.allclose(out.cpu(), torch.cos(x.cpu()) + y.cpu())
