"""Simulated ``torch_xla.distributed.xla_multiprocessing``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing
import torch_xla.runtime as xr


def spawn(
    fn: Callable[..., Any],
    args: tuple[Any, ...] = (),
    nprocs: int | None = None,
    join: bool = True,
    daemon: bool = False,
    start_method: str = "spawn",
) -> Any:
    if nprocs == 1:
        # torch_xla runs the function in this process with global ordinal 0.
        fn(xr.global_ordinal(), *args)
        return None
    if nprocs is not None:
        raise ValueError(
            f"Unsupported nprocs ({nprocs}). Please use nprocs=1 or None (default). If None, "
            "spawn will use all available devices. Use the environment variable X_NUM_DEVICES "
            "(where X is CPU, TPU, NEURONCORE, etc) to limit the number of devices used."
        )
    raise NotImplementedError(
        "xlasim does not simulate multi-process xmp.spawn (one process per TPU chip); use "
        "nprocs=1, or SPMD with one process per host"
    )


class MpModelWrapper:
    """A model built once (on CPU, at global scope) and moved to each process's device.

    ``to(device)`` moves the wrapped model itself (under a lock shared by the processes) and
    returns it.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self._model = model
        self._lock = torch.multiprocessing.Lock()

    def to(self, device: Any) -> torch.nn.Module:
        with self._lock:
            self._model.to(device)
        return self._model


class MpSerialExecutor:
    """Runs functions one process at a time (``run(fn)`` under a lock shared by the processes)."""

    def __init__(self) -> None:
        self._lock = torch.multiprocessing.Lock()

    def run(self, fn: Callable[[], Any]) -> Any:
        with self._lock:
            return fn()
