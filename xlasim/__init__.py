"""xlasim: run torch_xla programs on a CPU-only machine against a simulated TPU slice."""

from typing import Any

from tpu_backend._lazy import lazy_getattr
from xlasim._activation import is_active, simulate

__all__ = [
    "InputChange",
    "RecompilationError",
    "RecompilationReport",
    "assert_no_recompilation",
    "chip_memory",
    "chip_memory_table",
    "clear_recompilations",
    "compiled_graphs",
    "compiled_graphs_report",
    "current_runtime",
    "enforce_hbm",
    "is_active",
    "recompilation_report",
    "recompilations",
    "register_xla_device",
    "show_chip_memory",
    "simulate",
]

# Loaded on first use: `import xlasim` runs in every pytest session (the plugin) and at
# interpreter start under env activation, so it must not import torch.
_LAZY = {
    "InputChange": "xlasim.reports.recompilation",
    "RecompilationError": "xlasim.reports.recompilation",
    "RecompilationReport": "xlasim.reports.recompilation",
    "assert_no_recompilation": "xlasim.reports.recompilation",
    "clear_recompilations": "xlasim.reports.recompilation",
    "recompilation_report": "xlasim.reports.recompilation",
    "recompilations": "xlasim.reports.recompilation",
    "chip_memory": "xlasim.runtime.memory",
    "compiled_graphs": "xlasim.reports.compile_report",
    "compiled_graphs_report": "xlasim.reports.compile_report",
    "enforce_hbm": "xlasim.runtime.memory",
    "chip_memory_table": "xlasim.reports.memory_view",
    "show_chip_memory": "xlasim.reports.memory_view",
}


__getattr__ = lazy_getattr(__name__, _LAZY, globals())


def register_xla_device() -> None:
    """Registers the simulated ``xla`` device with PyTorch now.

    Entering a simulation does this too; call it first in a process that runs eager CPU
    training before simulating, because autograd fixes its set of devices at the first
    backward pass of a process.
    """
    # Deferred like _LAZY: importing xlasim must not import torch.
    from xlasim.runtime.device import ensure_device_guard

    ensure_device_guard()


def current_runtime() -> Any:
    """The active simulated runtime (``RuntimeError`` when no simulation is active)."""
    # Deferred like _LAZY: importing xlasim must not import torch.
    from xlasim.runtime import state

    return state.current()
