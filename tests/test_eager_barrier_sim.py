"""``xm.optimization_barrier_`` in eager mode runs at once, a graph per tensor. Measured on real
torch_xla 2.9 (``PJRT_DEVICE=CPU``): one tensor, one EagerOpCompileTime and one
EagerOpExecuteTime sample; two tensors, two of each; the same barrier again, two more
executions and no compile (upstream's eager/test_eager.py, CPU CI)."""

from __future__ import annotations

import torch

import xlasim


def test_eager_barrier_runs_a_graph_per_tensor():
    with xlasim.simulate("2x2x1", "v4"):
        import torch_xla
        import torch_xla.core.xla_model as xm
        import torch_xla.debug.metrics as met

        with torch_xla.experimental.eager_mode_context(True):
            device = torch_xla.device()
            t1 = torch.randn(5, 5, device=device)
            t2 = torch.randn(5, 5, device=device)
            met.clear_all()
            xm.optimization_barrier_([t1])
            assert met.metric_data("EagerOpCompileTime")[0] == 1
            assert met.metric_data("EagerOpExecuteTime")[0] == 1
            met.clear_all()
            xm.optimization_barrier_([t1, t2])
            assert met.metric_data("EagerOpCompileTime")[0] == 2
            xm.optimization_barrier_([t1, t2])
            assert met.metric_data("EagerOpCompileTime")[0] == 2
            assert met.metric_data("EagerOpExecuteTime")[0] == 4
