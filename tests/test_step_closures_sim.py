"""Step closures (``xm.add_step_closure``) on the simulator. The orders and errors are real
torch_xla 2.9's (its upstream test_async_closures passes on PJRT CPU): synchronous closures run
inside the sync, asynchronous ones on one worker thread while the caller goes on, and after an
asynchronous closure raised, the next one queued is refused."""

from __future__ import annotations

import threading

import pytest


def test_sync_closures_run_inside_the_sync_with_their_args(xlasim_sim):
    import torch_xla
    import torch_xla.core.xla_model as xm

    seen = []
    xm.add_step_closure(lambda a, b: seen.append((a, b, threading.current_thread())), (1, 2))
    assert seen == []
    torch_xla.sync()
    assert seen == [(1, 2, threading.current_thread())]


def test_async_closures_run_in_order_on_a_worker(xlasim_sim):
    import torch_xla
    import torch_xla.core.xla_model as xm

    go, done = threading.Event(), threading.Event()
    seen = []
    xm.add_step_closure(lambda: (go.wait(5), seen.append(threading.current_thread())), (), True)
    xm.add_step_closure(lambda: (seen.append(2), done.set()), run_async=True)
    torch_xla.sync()
    assert seen == []  # the caller got here while the first closure still waits
    go.set()
    assert done.wait(5)
    assert seen[0] is not threading.current_thread() and seen[1] == 2


def test_after_an_async_closure_raised_the_next_is_refused(xlasim_sim):
    import torch_xla
    import torch_xla.core.xla_model as xm

    raised = threading.Event()

    def fail():
        raised.set()
        raise ValueError("in closure")

    xm.add_step_closure(fail, run_async=True)
    torch_xla.sync()
    assert raised.wait(5)
    xm.add_step_closure(lambda: None, run_async=True)
    with pytest.raises(
        RuntimeError, match="^Cannot run asynchronous closure due to previously raised exception$"
    ) as info:
        for _ in range(50):  # the worker ends just after the closure raised
            torch_xla.sync()
            xm.add_step_closure(lambda: None, run_async=True)
    assert isinstance(info.value.__cause__, ValueError)
