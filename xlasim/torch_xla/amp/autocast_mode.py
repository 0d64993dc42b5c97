"""``torch_xla.amp.autocast``: ``torch.autocast('xla')`` restricted to what XLA:TPU supports.

The cast policy itself is the ``AutocastXLA`` kernels (:mod:`xlasim.runtime.autocast` registers
torch_xla's); this class only chooses the dtype the way torch_xla 2.9 does: bfloat16 on TPU
(another dtype warns and disables autocast), and on any other hardware a printed warning after
which the object is unusable as a context manager, as in torch_xla.
"""

from __future__ import annotations

import warnings

import torch
import torch_xla.core.xla_model as xm

# Hardware kinds on which torch_xla 2.9 enables autocast.
_AUTOCAST_HW = ("TPU", "NEURON")


class autocast(torch.amp.autocast_mode.autocast):  # noqa: N801 - torch_xla's public name
    def __init__(
        self,
        device,
        enabled: bool = True,
        dtype: torch.dtype | None = None,
        cache_enabled: bool = True,
    ) -> None:
        assert "xla" in str(device), "torch_xla.autocast is available for XLA:TPU"
        self._enabled = enabled
        self._xla_device = xm.xla_device_hw(device)
        if self._xla_device not in _AUTOCAST_HW:
            # torch_xla leaves the base class uninitialized here: entering then fails on the
            # missing `device` attribute.
            print("Warning: AMP only supported for XLA:TPU. Ignoring autocast.")
            return
        dtype = torch.bfloat16 if dtype is None else dtype
        if dtype != torch.bfloat16:
            warnings.warn(
                "In XLA:TPU autocast, but the target dtype is not supported. Disabling "
                "autocast.\nTPU Autocast only supports dtype of torch.bfloat16 currently.",
                stacklevel=2,
            )
            enabled = False
        self._dtype = dtype
        super().__init__("xla", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)
