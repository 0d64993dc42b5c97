"""Simulated ``torch_xla.distributed.xla_multiprocessing``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing
from torch_xla._internal import pjrt


def spawn(
    fn: Callable[..., Any],
    args: tuple[Any, ...] = (),
    nprocs: int | None = None,
    join: bool = True,
    daemon: bool = False,
    start_method: str = "spawn",
) -> Any:
    """``fn(global_ordinal, *args)`` in one process per local chip (``nprocs=None``), or in
    this process on one chip (``nprocs=1``); returns None, raises a process's exception."""
    reason = pjrt.unsimulated_reason() if nprocs is None else None
    if reason is not None:
        raise NotImplementedError(reason)
    return pjrt.spawn(fn, nprocs=nprocs, start_method=start_method, args=args)


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
