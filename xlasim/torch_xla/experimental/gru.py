"""Simulated ``torch_xla.experimental.gru``: ``GRU``, a ``torch.nn.GRU`` whose recurrence
runs as one ``torch_xla.experimental.scan`` per layer (one XLA While loop each on torch_xla,
instead of the graph of every time step). Importing torch_xla puts it in ``torch.nn.GRU``'s
place, the original kept as ``torch.nn.GRU._orig``.

It has ``torch.nn.GRU``'s parameters, methods and results (dropout between layers included);
``bidirectional=True`` gives the original class instead, with torch_xla's warning, and
``proj_size`` is refused as torch_xla refuses it. Each layer's input projection is one product
over all time steps; the scan carries the hidden state and the recurrent weights (a scanned
function's captured tensors get no gradient, its carry does).
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["GRU"]

_FALLBACK_WARNING = (
    "Scan-based GRU only supports unidirectional GRU. (bidirectional = False) "
    "Scan-based GRU falls back to the default nn.GRU implementation instead."
)


def _recurrence(carry: dict[str, Any], gates_x: torch.Tensor) -> tuple[dict[str, Any], Any]:
    """One time step: ``gates_x`` is the input's projection (reset, update, new gates)."""
    h = carry["h"]
    gates_h = F.linear(h, carry["w_hh"], carry.get("b_hh"))
    reset_x, update_x, new_x = gates_x.chunk(3, dim=-1)
    reset_h, update_h, new_h = gates_h.chunk(3, dim=-1)
    reset = torch.sigmoid(reset_x + reset_h)
    update = torch.sigmoid(update_x + update_h)
    candidate = torch.tanh(new_x + reset * new_h)
    h = candidate + update * (h - candidate)  # (1 - z) * n + z * h
    return {**carry, "h": h}, h


class GRU(nn.GRU):
    """``torch.nn.GRU`` computed with one scan per layer (unidirectional, no projection)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("bidirectional", False):
            logging.warning(_FALLBACK_WARNING)
            return (getattr(nn.GRU, "_orig", None) or nn.GRU)(*args, **kwargs)
        return super().__new__(cls)

    # forward and __init__ keep torch.nn.GRU's signatures exactly (no annotations): the class
    # stands in for it, and code compares the two.
    def __init__(self, *args, **kwargs):
        if kwargs.get("bidirectional", False):
            raise AssertionError("GRU only supports unidirectional GRU.")
        if kwargs.get("proj_size", 0) != 0:
            raise AssertionError("GRU only supports no projection.")
        super().__init__(*args, **kwargs)

    def forward(self, input, hx=None):  # noqa: A002
        if input.dim() not in (2, 3):
            raise ValueError(f"GRU: Expected input to be 2D or 3D, got {input.dim()}D instead")
        batched = input.dim() == 3
        if batched and hx is not None and hx.dim() != 3:
            raise RuntimeError(
                f"For batched 3-D input, hx should also be 3-D but got {hx.dim()}-D tensor"
            )
        if not batched:
            if hx is not None and hx.dim() != 2:
                raise RuntimeError(
                    f"For unbatched 2-D input, hx should also be 2-D but got {hx.dim()}-D tensor"
                )
            input = input.unsqueeze(0 if self.batch_first else 1)
            hx = None if hx is None else hx.unsqueeze(1)
        steps = input.transpose(0, 1) if self.batch_first else input  # (time, batch, feature)
        if hx is None:
            hx = steps.new_zeros(self.num_layers, steps.size(1), self.hidden_size)
        self.check_forward_args(input, hx, None)
        # Loaded on first use: scan brings AOTAutograd, seconds of imports that importing
        # torch_xla (which puts this class in place) should not pay.
        scan = importlib.import_module("torch_xla.experimental.scan").scan
        finals = []
        for layer in range(self.num_layers):
            weights = {"h": hx[layer], "w_hh": getattr(self, f"weight_hh_l{layer}")}
            bias_ih = None
            if self.bias:
                bias_ih = getattr(self, f"bias_ih_l{layer}")
                weights["b_hh"] = getattr(self, f"bias_hh_l{layer}")
            gates_x = F.linear(steps, getattr(self, f"weight_ih_l{layer}"), bias_ih)
            last, steps = scan(_recurrence, weights, gates_x, is_fn_pure=True)
            finals.append(last["h"])
            if self.dropout > 0 and layer + 1 < self.num_layers:
                steps = F.dropout(steps, p=self.dropout, training=self.training)
        hidden = torch.stack(finals)
        output = steps.transpose(0, 1) if self.batch_first else steps
        if not batched:
            output = output.squeeze(0 if self.batch_first else 1)
            hidden = hidden.squeeze(1)
        return output, hidden
