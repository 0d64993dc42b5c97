"""Profile capture on the simulator: the simulated chips record no activity, so capturing a
trace is refused by name (real torch_xla on CPU captures host events), while the annotations
and the server handle work (their behaviour is checked against real torch_xla in
conformance/test_profiler_annotations.py)."""

from __future__ import annotations

import threading

import pytest


def test_capture_is_refused_by_name(xlasim_sim):
    import torch_xla.debug.profiler as xp

    with pytest.raises(
        NotImplementedError, match=r"profile capture \(torch_xla\.debug\.profiler\.trace"
    ):
        xp.trace("localhost:9012", "/tmp/profile", duration_ms=10)
    with pytest.raises(NotImplementedError, match=r"start_trace\('/tmp/p'\)"):
        xp.start_trace("/tmp/p")
    with pytest.raises(RuntimeError, match="No profile started"):
        xp.stop_trace()


def test_detached_trace_fails_in_its_thread_only(xlasim_sim, monkeypatch):
    import torch_xla.debug.profiler as xp

    errors = []
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(args.exc_type))
    before = set(threading.enumerate())
    xp.trace_detached("localhost:9012", "/tmp/profile", duration_ms=10)
    for thread in set(threading.enumerate()) - before:
        thread.join(timeout=30)  # bounded: the thread only raises
    assert errors == [NotImplementedError]
