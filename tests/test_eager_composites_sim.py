"""Eager mode around ``torch.compile`` and PyTorch's composite ``allclose``.

Expected values measured on real torch_xla 2.9 on CPU (``PJRT_DEVICE=CPU``)."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.topology("2x2x1", accelerator="v4")
def test_compiled_program_runs_as_one_graph_in_eager_mode(xlasim_sim):
    # Real: two calls of a compiled function in eager mode run two programs (ExecuteTime 2)
    # and no eager op.
    import torch_xla
    import torch_xla.debug.metrics as met

    torch_xla.experimental.eager_mode(True)
    try:
        d = torch_xla.device()
        x = torch.arange(6.0, device=d).reshape(2, 3)
        f = torch.compile(lambda t: torch.tanh(t) * 2 + 1, backend="openxla")
        f(x)
        torch_xla.sync()
        met.clear_all()
        z = f(f(x))
        torch_xla.sync()
        assert met.metric_data("ExecuteTime")[0] == 2
        assert met.metric_data("EagerOpExecuteTime") is None
        expected = torch.tanh(torch.tanh(x.cpu()) * 2 + 1) * 2 + 1
        assert torch.allclose(z.cpu(), expected)
    finally:
        torch_xla.experimental.eager_mode(False)


@pytest.mark.topology("2x2x1", accelerator="v4")
def test_allclose_runs_its_ops_as_one_graph(xlasim_sim):
    # Real: allclose of two synced device tensors runs one graph (ExecuteTime 1), counts the
    # kernels of isclose's ops, all, and reads the answer through the CPU fallback.
    import torch_xla
    import torch_xla.debug.metrics as met

    d = torch_xla.device()
    a = torch.randn(5, 5).to(d)
    b = torch.randn(5, 5).to(d)
    torch_xla.sync()
    met.clear_all()
    assert torch.allclose(a, a.clone() + b * 0)
    assert met.metric_data("ExecuteTime")[0] == 1
    for name in ("xla::abs", "xla::le", "xla::all", "xla::_to_cpu", "aten::_local_scalar_dense"):
        assert name in met.counter_names()


@pytest.mark.topology("2x2x1", accelerator="v4")
def test_allclose_in_eager_mode_runs_each_op(xlasim_sim):
    # Real: 15 eager executions (isclose's ops one by one, b + 1 among them); more than the 5
    # upstream's eager test counts on.
    import torch_xla
    import torch_xla.debug.metrics as met

    torch_xla.experimental.eager_mode(True)
    try:
        d = torch_xla.device()
        a = torch.randn(5, 5).to(d)
        b = torch.randn(5, 5).to(d)
        torch_xla.sync()
        met.clear_all()
        assert not torch.allclose(a, b + 1)
        assert met.metric_data("EagerOpExecuteTime")[0] > 5
    finally:
        torch_xla.experimental.eager_mode(False)
