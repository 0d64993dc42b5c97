"""A training BatchNorm's running statistics are values of the op's own graph.

Measured on real torch_xla 2.9 on CPU: after a BatchNorm2d forward in training the running
mean is a pending IR value (``xla::moving_average`` over the batch statistics) until the step
runs; in eager mode the op's outputs and both statistics run as one graph (three eager
executions in all, with the two before it), leaving the running mean as device data."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.topology("2x2x1", accelerator="v4")
def test_eager_batch_norm_computes_its_running_stats(xlasim_sim):
    import torch_xla
    import torch_xla.debug.metrics as met

    torch_xla.experimental.eager_mode(True)
    try:
        d = torch_xla.device()
        m = torch.nn.BatchNorm2d(4).to(d)
        x = torch.randn(2, 4, 3, 3).to(d)
        torch_xla.sync()
        met.clear_all()
        m(x)
        assert met.metric_data("EagerOpExecuteTime")[0] == 3
        info = torch_xla._XLAC._get_xla_tensor_debug_info(m.running_mean)
        assert "IR: None" in info
        assert "Data Shape: f32[4]" in info
    finally:
        torch_xla.experimental.eager_mode(False)


@pytest.mark.topology("2x2x1", accelerator="v4")
def test_lazy_batch_norm_leaves_running_stats_pending(xlasim_sim):
    import torch_xla

    d = torch_xla.device()
    m = torch.nn.BatchNorm2d(4).to(d)
    x = torch.randn(2, 4, 3, 3).to(d)
    torch_xla.sync()
    expected = (0.9 * m.running_mean.cpu() + 0.1 * x.cpu().mean(dim=(0, 2, 3))).clone()
    m(x)
    with pytest.raises(NotImplementedError, match="pending op's IR node"):
        torch_xla._XLAC._get_xla_tensor_debug_info(m.running_mean)
    torch_xla.sync()
    assert torch.allclose(m.running_mean.cpu(), expected, atol=1e-6)
    assert "Data Shape: f32[4]" in torch_xla._XLAC._get_xla_tensor_debug_info(m.running_mean)
