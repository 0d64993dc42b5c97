"""Simulated ``torch_xla.debug.profiler``.

Annotations work: ``Trace``/``StepTrace`` scopes and ``trace_me`` wrap code as on a TPU host
(``StepTrace`` ends its step with a sync, as torch_xla's does) and ``start_server`` gives a
server handle. Capturing a profile cannot be simulated: the simulated chips record no device
activity, so ``trace`` and ``start_trace`` raise ``NotImplementedError`` naming that.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import torch_xla
import torch_xla.core.xla_model as xm

from xlasim.runtime import ir_scopes

_TRACER_MARKED_STEP = False


def set_tracer_marked_step(value: bool) -> None:
    global _TRACER_MARKED_STEP
    _TRACER_MARKED_STEP = value


def get_tracer_marked_step() -> bool:
    return _TRACER_MARKED_STEP


class ProfilerServer:
    """The handle ``start_server`` returns; the simulated host serves no profiles."""

    def __init__(self, port: int) -> None:
        self.port = port

    def __repr__(self) -> str:
        return f"<xlasim ProfilerServer on port {self.port} (serves no profiles)>"


def start_server(port: int, only_on_master: bool = True) -> ProfilerServer | None:
    """A profiler server handle on ``port`` (None off the master ordinal when
    ``only_on_master``). torch_xla only logs a port it cannot bind, so no port is refused;
    a non-integer one is pybind's TypeError."""
    if not isinstance(port, int):
        raise TypeError(
            "start_server(): incompatible function arguments. The following argument types "
            f"are supported:\n    1. (port: typing.SupportsInt) -> "
            f"_XLAC.profiler.ProfilerServer\n\nInvoked with: {port!r}"
        )
    if only_on_master and not xm.is_master_ordinal():
        return None
    return ProfilerServer(port)


def _no_capture(what: str) -> NotImplementedError:
    return NotImplementedError(
        f"xlasim does not simulate profile capture ({what}): the simulated TPU chips record "
        f"no device activity to trace; torch_xla.debug.profiler's Trace, StepTrace and "
        f"trace_me annotations and start_server work on the simulator"
    )


def trace(
    service_addr: str,
    logdir: str,
    duration_ms: int = 1000,
    num_tracing_attempts: int = 3,
    host_tracer_level: int = 2,
    device_tracer_level: int = 1,
    delay_ms: int = 0,
    timeout_s: int = 120,
    interval_s: int = 5,
) -> None:
    raise _no_capture(f"torch_xla.debug.profiler.trace({service_addr!r}, {logdir!r})")


def trace_detached(*args: Any, **kwargs: Any) -> None:
    """``trace`` in a background thread (its error is the thread's, not the caller's)."""
    threading.Thread(target=trace, args=args, kwargs=kwargs).start()


class Trace:
    """A named profiling scope (``with xp.Trace('fwd'): ...``); extra keyword arguments are
    the event's metadata, as torch_xla takes them."""

    def __init__(self, name: str, **kwargs: Any) -> None:
        self.name = name
        self.metadata = kwargs
        self._scoped = False

    def __enter__(self) -> None:  # torch_xla's gives no value to ``as`` either
        # The trace is also an IR scope: a step barrier inside it is an error.
        ir_scopes.push(self.name)
        self._scoped = True
        return None

    def _close_scope(self) -> None:
        if self._scoped:
            self._scoped = False
            ir_scopes.pop()

    def __exit__(self, *exc_info: Any) -> None:
        self._close_scope()
        return None


class StepTrace(Trace):
    """A training step's scope: marks the trace as step-marked and syncs when the step ends."""

    def __enter__(self) -> None:
        set_tracer_marked_step(True)
        super().__enter__()

    def __exit__(self, *exc_info: Any) -> None:
        self._close_scope()  # closed before the step's barrier, which needs no open scope
        torch_xla.sync()


def trace_me(scope: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: every call of the function runs inside ``Trace(scope)``."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def traced(*args: Any, **kwargs: Any) -> Any:
            with Trace(scope):
                return func(*args, **kwargs)

        return traced

    return decorate


def start_trace(log_dir: Any) -> None:
    raise _no_capture(f"torch_xla.debug.profiler.start_trace({str(log_dir)!r})")


def stop_trace() -> None:
    # start_trace never starts a session here, so this is torch_xla's answer to a stop with
    # none started.
    raise RuntimeError("No profile started")
