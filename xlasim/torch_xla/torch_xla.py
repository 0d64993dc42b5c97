"""Top-level ``torch_xla`` functions (``torch_xla.device()``, ``sync()``, ``compile()``...)."""

from __future__ import annotations

import contextlib
import uuid
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch_xla._XLAC as _XLAC
import torch_xla.core.xla_model as xm
import torch_xla.distributed.xla_multiprocessing as xmp
import torch_xla.runtime as xr

from xlasim.runtime import state as _runtime


def device(index: int | None = None) -> torch.device:
    """Returns an XLA device (under SPMD always the virtual ``xla:0``); an index makes that
    device the default."""
    rt = _runtime.current()
    rt.start()  # as in torch_xla, asking for a device starts the runtime (its PJRT client)
    if rt.spmd:
        rt.default_device_index = 0
    elif index is not None:
        names = xm.get_xla_supported_devices()
        # torch_xla's bound check lets index == len through to the lookup (an IndexError too).
        if index > len(names):
            raise IndexError(f"Device index {index} out of range in {names}")
        rt.default_device_index = torch.device(names[index]).index
    return torch.device("xla", rt.default_device_index)


def devices() -> list[torch.device]:
    return [torch.device("xla", i) for i in range(len(_runtime.current().xla_devices()))]


def real_devices() -> list[str]:
    return _runtime.current().real_devices()


def device_count() -> int:
    """How many devices this process addresses (its host's chips, also under SPMD)."""
    return len(_runtime.current().addressable_device_ids())


def sync(wait: bool = False, reset_scope: bool = True) -> None:
    """Launches all pending graph operations, then runs step closures.

    Simulated execution finishes before this returns, so ``wait`` changes nothing. With
    ``reset_scope`` a profiler scope still open here is an error.
    """
    # Through the pybind entry point, as torch_xla does: a failed compile raises its error type.
    _XLAC._xla_step_marker(reset_scope=reset_scope)
    xm._run_step_closures()


def step() -> Any:
    return compile()


def compile(
    f: Callable[..., Any] | None = None,
    full_graph: bool | None = False,
    name: str | None = None,
    max_different_graphs: int | None = None,
) -> Any:
    """Traces ``f`` (or the ``with`` body) into graphs with eager mode off, syncing before and
    after; ``full_graph`` makes any execution before the closing sync an error (torch_xla's
    RuntimeError), so the traced region is one graph."""
    if name is None and f is not None:
        name = getattr(f, "__name__", None) or str(f)
    # The dynamic-shape detector's session: one per function while it lives (a new function
    # that reuses a dead one's id starts afresh), one per use of the context manager.
    session = f"{name}_{id(f)}" if f is not None else str(uuid.uuid4())
    if session not in _compiled_functions:
        _XLAC._dynamic_shape_detector_remove_session(session)
    if f is not None:
        _compiled_functions[session] = f

    @contextlib.contextmanager
    def _compile():
        saved = (
            _XLAC._get_use_eager_mode(),
            _XLAC._get_allow_execution(),
            _XLAC._get_current_graph_name(),
        )
        _XLAC._set_use_eager_mode(False)
        if name is not None:
            _XLAC._set_current_graph_name(f"{name}_clear_pending")
        _clear_pending_ops_before_compile()
        if name is not None:
            _XLAC._set_current_graph_name(name)
        _XLAC._set_allow_execution(not full_graph)
        if max_different_graphs is not None:
            _XLAC._dynamic_shape_detector_set_max_different_graphs(max_different_graphs)
            _XLAC._dynamic_shape_detector_start_session(session)
        try:
            yield
        finally:
            _XLAC._set_allow_execution(saved[1])
            if max_different_graphs is not None:
                _XLAC._dynamic_shape_detector_end_session()
            sync()
            _XLAC._set_use_eager_mode(saved[0])
            _XLAC._set_current_graph_name(saved[2])

    return _compile() if f is None else _compile()(f)


# The functions compiled so far, by session id, while they live.
_compiled_functions: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()


def _clear_pending_ops_before_compile() -> None:
    # What was pending before the call is not part of the compiled graph. The name is torch_xla's:
    # PT_XLA_DEBUG tells this sync from the compiled function's own by it.
    sync()


def manual_seed(seed: int, device: Any = None) -> None:
    """Sets the seed of the simulated device's random number generator."""
    # The simulated slice has one generator, so every device gets the seed.
    _runtime.current().manual_seed(seed)


def launch(
    fn: Callable[..., Any],
    args: tuple[Any, ...] = (),
    start_method: str = "spawn",
    debug_single_process: bool = False,
) -> Any:
    if xr.is_spmd():
        raise NotImplementedError("launch function does not support SPMD at this time")
    nprocs = 1 if debug_single_process else None  # None: one process per device
    xmp.spawn(fn, args=args, nprocs=nprocs, start_method=start_method)
