"""``torch_xla.debug.profiler``'s annotations, as real torch_xla 2.9 runs them: ``Trace``
scopes and ``trace_me`` leave the traced work pending, a ``StepTrace`` ends its step with a
sync, and ``start_server`` gives a handle on the master ordinal."""

from __future__ import annotations


def test_trace_scopes_and_step_trace_sync(xla_target):
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met
    import torch_xla.debug.profiler as xp

    server = xp.start_server(9231)
    assert server is not None
    x = torch.ones(3, device=torch_xla.device())
    torch_xla.sync()
    xm.wait_device_ops()  # torch_xla executes asynchronously: its timing lands after the sync
    met.clear_all()
    with xp.StepTrace("train_step", step_num=0) as entered:
        assert entered is None
        with xp.Trace("forward", phase="fwd"):
            y = x * 2
        assert met.counter_value("MarkStep") is None  # a Trace does not sync
    assert met.counter_value("MarkStep") == 1  # the StepTrace did
    xm.wait_device_ops()
    assert met.metric_data("ExecuteTime")[0] == 1
    assert xp.get_tracer_marked_step() is True

    @xp.trace_me("add_one")
    def add_one(t):
        """Adds one."""
        return t + 1

    assert add_one.__name__ == "add_one" and add_one.__doc__ == "Adds one."
    assert add_one(y).cpu().tolist() == [3.0, 3.0, 3.0]
    xp.set_tracer_marked_step(False)
    assert xp.get_tracer_marked_step() is False


def test_start_server_takes_any_int_port(xla_target):
    import pytest
    import torch_xla.debug.profiler as xp

    assert xp.start_server(70000) is not None  # an unusable port is only logged
    with pytest.raises(TypeError, match="incompatible function arguments"):
        xp.start_server("9012")


def test_step_barrier_inside_a_trace_scope_is_an_error(xla_target):
    # Real torch_xla 2.9: a Trace is also an IR scope, numbered per nesting level from 1 after
    # each step barrier, and a barrier that resets scopes fails while one is open.
    import pytest
    import torch_xla
    import torch_xla.debug.profiler as xp

    torch_xla.sync()
    with (
        pytest.raises(
            RuntimeError, match=r"^Expecting scope to be empty but it is outer\.1/inner\.1$"
        ),
        xp.Trace("outer"),
        xp.Trace("inner"),
    ):
        torch_xla.sync()
    torch_xla.sync()  # the scopes closed with their blocks
    with xp.Trace("kept"):
        torch_xla.sync(reset_scope=False)  # no reset, no check
    with xp.StepTrace("step", step_num=0):  # its own scope closes before its barrier
        pass
