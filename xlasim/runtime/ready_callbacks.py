"""``_on_ready_callback``: run a function once a device tensor's buffer is ready.

Simulated execution is synchronous, so a buffer that exists is already ready and the function
runs at once on the caller's thread (as torch_xla 2.9 on CPU runs it for a buffer computed
before the call). A tensor without a buffer of its own fails with torch_xla's errors: a pending
op's value, data moved from the host that torch_xla holds as a ``device_data`` IR value, and
SPMD data still on the host.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from xlasim.runtime.debug_info import holds_data_ir, only_on_host


def on_ready(rt: Any, t: Any, callback: Callable[[], object]) -> None:
    """Calls ``callback()`` for the simulator tensor ``t`` once its buffer is ready."""
    if t._node is not None:
        raise RuntimeError(
            "Could not get the buffer pointer for XLATensor with IR that's not DeviceData"
        )
    if only_on_host(rt, t):
        raise RuntimeError("received invalid data pointer")
    if holds_data_ir(rt, t):
        raise RuntimeError("Could not get buffer for tensor")
    callback()
