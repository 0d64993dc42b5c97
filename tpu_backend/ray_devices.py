"""Ray Train's device helpers on our TPU workers: ``ray.train.torch.get_device()``,
``prepare_model()`` and ``prepare_data_loader()`` give torch_xla's device.

Ray 2.60 picks a torch device manager from the worker's accelerator resources; for ``TPU`` it
is one built on ``torch_tpu`` (another PyTorch TPU backend), which fails where only torch_xla is
installed. And a data loader prepared for a device looks up a manager by the device's type,
which knows no ``xla``. :func:`install` (run by the worker bootstrap, after torch_xla is set
up) puts an XLA device manager in both places, so a Ray Train loop written the usual way moves
its model and batches to ``torch_xla.device()``.  Under SPMD :mod:`tpu_backend.ray_prepare`
also replaces the wrapping Ray picks (no DDP; batches split over the mesh).

Both places are Ray internals (``ray.air._internal.device_manager``): if a Ray release moves
them, :func:`install` raises naming what it did not find instead of leaving Ray's choice.
"""

from __future__ import annotations

import threading
from contextlib import nullcontext
from typing import Any

import torch
from ray.air._internal import device_manager as _managers
from ray.air._internal.device_manager.torch_device_manager import TorchDeviceManager
from ray.train.torch import train_loop_utils as _loop_utils

_LOCK = threading.Lock()


class XlaTorchDeviceManager(TorchDeviceManager):
    """Ray's device-manager interface over torch_xla: one device per process, no streams."""

    def is_available(self) -> bool:
        return True

    def get_devices(self) -> list[torch.device]:
        import torch_xla  # deferred: imported by the bootstrap first, with its environment set

        return [torch_xla.device()]

    def set_device(self, device: Any) -> None:
        # torch_xla binds a process to its device(s) when the runtime starts.
        pass

    def supports_stream(self) -> bool:
        return False

    def get_stream_context(self, stream: Any) -> Any:
        return nullcontext()


def _by_device_type(original: Any) -> Any:
    def lookup(device_type: str) -> Any:
        if device_type == "xla":
            return XlaTorchDeviceManager()
        return original(device_type)

    lookup._xla_wraps = original  # type: ignore[attr-defined]
    return lookup


def install() -> None:
    """Make Ray Train's device helpers on this worker process use torch_xla's device."""
    missing = [
        name
        for module, name in (
            (_managers, "_torch_device_manager"),
            (_loop_utils, "get_torch_device_manager_by_device_type"),
        )
        if not hasattr(module, name)
    ]
    if missing:
        raise RuntimeError(
            f"this Ray release has no {', '.join(missing)}: tpu_backend cannot point "
            "ray.train.torch.get_device()/prepare_model()/prepare_data_loader() at torch_xla; "
            "use torch_xla.device() directly"
        )
    with _LOCK:
        _managers._torch_device_manager = XlaTorchDeviceManager()  # type: ignore[assignment]
        lookup = _loop_utils.get_torch_device_manager_by_device_type
        if not hasattr(lookup, "_xla_wraps"):
            _loop_utils.get_torch_device_manager_by_device_type = _by_device_type(lookup)
