"""``dst.copy_(src)`` between device tensors: torch_xla gives ``dst`` the IR value of ``src``.

Expected values were measured with real torch_xla 2.9 on CPU (``PJRT_DEVICE=CPU``), reading
``ExecuteTime`` after ``xm.wait_device_ops()``.
"""

from __future__ import annotations

import torch

import xlasim


def _executions() -> int:
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met

    xm.wait_device_ops()
    data = met.metric_data("ExecuteTime")
    return data[0] if data else 0


def test_copy_of_device_data_runs_nothing():
    # torch_xla 2.9 on CPU: copying device data of the same dtype and shape leaves dst as
    # device data (nothing to materialize, a sync runs nothing, nor does reading it), with
    # src's values, kept when src is written afterwards.
    with xlasim.simulate("2x2"):
        import torch_xla
        import torch_xla.debug.metrics as met

        dev = torch_xla.device()
        a = torch.tensor([1.0, 2.0]).to(dev)
        b = torch.tensor([3.0, 4.0]).to(dev)
        c = a + 1  # computed data: the output of an executed graph
        torch_xla.sync()
        met.clear_all()
        b.copy_(c)
        assert torch_xla._XLAC._check_tensor_need_materialization([b]) == [False]
        torch_xla.sync()
        assert b.cpu().tolist() == [2.0, 3.0]
        assert _executions() == 0
        b.copy_(a)
        a.add_(1)
        torch_xla.sync()
        assert b.cpu().tolist() == [1.0, 2.0]
        assert a.cpu().tolist() == [2.0, 3.0]
        assert _executions() == 1  # a's update only


def test_copy_that_converts_or_broadcasts_is_computed():
    # torch_xla 2.9 on CPU: a copy that casts (f32 into f64), broadcasts, or takes a pending
    # value leaves dst pending, and the sync runs it.
    with xlasim.simulate("2x2"):
        import torch_xla
        import torch_xla.debug.metrics as met

        dev = torch_xla.device()
        a = torch.tensor([1.0, 2.0]).to(dev)
        wide = torch.zeros(2, dtype=torch.float64).to(dev)
        rows = torch.zeros(3, 2).to(dev)
        b = torch.zeros(2).to(dev)
        torch_xla.sync()
        for dst, src in ((wide, lambda: a), (rows, lambda: a), (b, lambda: a * 2)):
            met.clear_all()
            dst.copy_(src())
            assert torch_xla._XLAC._check_tensor_need_materialization([dst]) == [True]
            torch_xla.sync()
            assert _executions() == 1
        assert wide.cpu().tolist() == [1.0, 2.0]
        assert rows.cpu().tolist() == [[1.0, 2.0]] * 3
        assert b.cpu().tolist() == [2.0, 4.0]
