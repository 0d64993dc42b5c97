"""xlasim: run torch_xla programs on a CPU-only machine against a simulated TPU slice."""

from xlasim._activation import is_active, simulate

__all__ = ["current_runtime", "is_active", "simulate"]


def current_runtime():
    """The active simulated runtime (``RuntimeError`` when no simulation is active)."""
    from xlasim import _runtime

    return _runtime.current()
