"""Top-level ``torch_xla`` functions (``torch_xla.device()``, ``sync()``, ``compile()``...)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.distributed.xla_multiprocessing as xmp
import torch_xla.runtime as xr


def device(index: int | None = None) -> torch.device:
    """Returns an XLA device (under SPMD always the virtual ``xla:0``)."""
    if xr.is_spmd():
        torch_xla._XLAC._xla_set_default_device("xla:0")
        return torch.device("xla:0")
    if index is None:
        return torch.device(torch_xla._XLAC._xla_get_default_device())
    devices_ = xm.get_xla_supported_devices()
    if index > len(devices_):
        raise IndexError(f"Device index {index} out of range in {devices_}")
    chosen = devices_[index]
    torch_xla._XLAC._xla_set_default_device(chosen)
    return torch.device(chosen)


def devices() -> list[torch.device]:
    return [torch.device(d) for d in xm.get_xla_supported_devices()]


def real_devices() -> list[str]:
    return torch_xla._XLAC._xla_real_devices()


def device_count() -> int:
    return len(real_devices())


def sync(wait: bool = False, reset_scope: bool = True) -> None:
    """Launches all pending graph operations, then runs step closures."""
    torch_xla._XLAC._xla_step_marker(
        torch_xla._XLAC._xla_get_default_device(), [], wait=wait, reset_scope=reset_scope
    )
    xm._run_step_closures()


def step() -> Any:
    return compile()


def compile(
    f: Callable[..., Any] | None = None,
    full_graph: bool | None = False,
    name: str | None = None,
    max_different_graphs: int | None = None,
) -> Any:
    """Traces ``f`` (or the ``with`` body) into graphs, syncing before and after."""
    if full_graph:
        raise NotImplementedError(
            "xlasim does not simulate torch_xla.compile(full_graph=True): it cannot tell "
            "when real torch_xla would split the traced function into several graphs"
        )
    if max_different_graphs is not None:
        raise NotImplementedError(
            "xlasim does not simulate torch_xla.compile(max_different_graphs=...)"
        )

    @contextlib.contextmanager
    def _compile():
        sync()
        try:
            yield
        finally:
            sync()

    return _compile() if f is None else _compile()(f)


def manual_seed(seed: int, device: Any = None) -> None:
    """Sets the seed of the simulated device's random number generator."""
    if device is None:
        device = torch_xla._XLAC._xla_get_default_device()
    torch_xla._XLAC._xla_set_rng_seed(seed, str(device))


def launch(
    fn: Callable[..., Any],
    args: tuple[Any, ...] = (),
    start_method: str = "spawn",
    debug_single_process: bool = False,
) -> Any:
    if xr.is_spmd():
        raise NotImplementedError("launch function does not support SPMD at this time")
    return xmp.spawn(
        fn, args=args, nprocs=1 if debug_single_process else None, start_method=start_method
    )
