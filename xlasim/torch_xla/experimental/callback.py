"""``torch_xla.experimental.callback``: be told when a device tensor's buffer is ready."""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch
import torch_xla


def on_ready_callback(tensor: torch.Tensor, callback: Callable[[torch.Tensor], None]) -> None:
    """Calls ``callback(tensor)`` once ``tensor``'s buffer is ready."""
    torch_xla._XLAC._on_ready_callback(tensor, lambda: callback(tensor))


def on_ready_event(tensor: torch.Tensor) -> threading.Event:
    """A ``threading.Event`` set once ``tensor``'s buffer is ready."""
    ready = threading.Event()
    torch_xla._XLAC._on_ready_callback(tensor, ready.set)
    return ready
