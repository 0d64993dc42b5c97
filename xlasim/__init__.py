"""xlasim: run torch_xla programs on a CPU-only machine against a simulated TPU slice."""

from xlasim._activation import is_active, simulate
from xlasim._device import ensure_device_guard as _ensure_device_guard

# Register the XLA device guard now: autograd sizes its device queues on the first backward
# pass of the process, so the guard must exist before any (even CPU-only) backward runs.
_ensure_device_guard()

__all__ = ["current_runtime", "is_active", "simulate"]


def current_runtime():
    """The active simulated runtime (``RuntimeError`` when no simulation is active)."""
    from xlasim import _runtime

    return _runtime.current()
