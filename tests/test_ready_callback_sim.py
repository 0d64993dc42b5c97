"""``torch_xla.experimental.callback`` on the simulator. Each expected outcome is real torch_xla
2.9's on PJRT CPU: a computed buffer runs the callback at once on the caller's thread, and a
tensor without a buffer of its own fails with the errors written here."""

from __future__ import annotations

import threading

import pytest
import torch


def test_a_computed_tensor_calls_back_on_the_callers_thread(xlasim_sim):
    import torch_xla
    from torch_xla.experimental import callback

    c = torch_xla.compile(lambda: torch.ones(3, device="xla") * 2)()
    seen = []
    callback.on_ready_callback(c, lambda t: seen.append((t is c, threading.current_thread())))
    assert seen == [(True, threading.current_thread())]
    assert callback.on_ready_event(c).is_set()
    assert "Data Handle: None" not in torch_xla._XLAC._get_xla_tensor_debug_info(c)


def test_a_callbacks_exception_reaches_the_caller(xlasim_sim):
    import torch_xla
    from torch_xla.experimental import callback

    c = torch.ones(2, device="xla") + 1
    torch_xla.sync()

    def fail(_):
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        callback.on_ready_callback(c, fail)


def test_tensors_without_their_own_buffer_are_refused(xlasim_sim):
    from torch_xla.experimental import callback

    moved = torch.tensor([1.0, 2.0]).to("xla")  # a device_data IR value until the next barrier
    with pytest.raises(RuntimeError, match="^Could not get buffer for tensor$"):
        callback.on_ready_event(moved)
    pending = moved + 1
    with pytest.raises(RuntimeError, match="with IR that's not DeviceData$"):
        callback.on_ready_event(pending)
    with pytest.raises(RuntimeError, match="^Expected XLA tensor. Got: torch.FloatTensor"):
        callback.on_ready_event(torch.ones(2))


def test_spmd_data_still_on_the_host_is_refused_until_a_barrier(xlasim_sim):
    import torch_xla
    import torch_xla.runtime as xr
    from torch_xla.experimental import callback

    xr.use_spmd()
    t = torch.tensor([1.0, 2.0]).to("xla")
    with pytest.raises(RuntimeError, match="^received invalid data pointer$"):
        callback.on_ready_event(t)
    torch_xla.sync()  # uploads it
    assert callback.on_ready_event(t).is_set()
