"""Simulated ``torch_xla.experimental.xla_quantized_matmul``: weight-only (and optionally
activation) quantized matmul as ``torch.ops.xla.quantized_matmul`` and ``XlaQuantizedLinear``.

The op is defined once per process (``xlasim.runtime.custom_ops``, torch_xla's schema); each
import of this module installs its two kernels:

- on the host (CPU tensors, or dynamo's fake tensors) the int8 weight is cast to the
  activation's dtype and multiplied as usual; with ``quantize_activation`` both operands are
  multiplied as int32 so the sums cannot wrap;
- on the device the int8 weight enters the product as it is: a product of two dtypes is one
  dot on torch_xla, its result in the activation's dtype (``xlasim.runtime.numerics``), and
  a quantized activation is multiplied with the weight by ``_xla_dot_general`` into int32.

Weights are per output channel (``[out, in]``, scaler ``[out]``) or blockwise
(``[in / block_size, block_size, out]``, scaler ``[in / block_size, out]``); an optional
zero point has the scaler's shape. ``int4_weight`` holds int4 values in an int8 tensor.
The shape checks raise torch_xla's assertion messages.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
import torch_xla

from xlasim.runtime import custom_ops

__all__ = ["XlaQuantizedLinear", "quantized_matmul", "quantized_matmul_xla"]

# Contracts a blockwise weight's block dim with the activation's, per block, then sums the
# blocks weighted by their scalers.
_PER_BLOCK = "scn,...sc->...sn"
_SCALED_BLOCKS = "sn,...sn->...n"
_ZERO_POINT = "...c,z->...z"


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise AssertionError(message)


def _check_per_channel(
    in_dim: int, out_dim: int, w: torch.Tensor, scaler: torch.Tensor, zero_point: Any
) -> None:
    _check(w.dtype == torch.int8, f"Weight dtype is expected to be torch.int8, got {w.dtype}.")
    _check(w.dim() == 2, f"Weight tensor is expected to be 2D, got {w.dim()}D Tensor.")
    shape = list(w.shape)
    _check(
        shape == [out_dim, in_dim],
        "Weight shape is expected to be [output_dim, input_dim], "
        f"output_dim: {out_dim}, input_dim: {in_dim}, but got {shape}.",
    )
    _check(
        scaler.dim() == 1 and scaler.shape[0] == shape[0],
        "weight scaler shape is expect to be [out_channel,], "
        f"got {scaler.shape}, weight shape {shape}.",
    )
    if zero_point is not None:
        _check(
            zero_point.dim() == 1 and scaler.shape[0] == shape[0],
            "zero point shape is expect to be [out_channel,], "
            f"got {zero_point.shape}, weight shape {shape}.",
        )


def _check_blockwise(
    in_dim: int,
    out_dim: int,
    block_size: int,
    w: torch.Tensor,
    scaler: torch.Tensor,
    zero_point: Any,
) -> None:
    _check(w.dtype == torch.int8, f"Weight dtype is expected to be torch.int8, got {w.dtype}.")
    _check(w.dim() == 3, f"Weight tensor is expected to be 3D, got {w.dim()}D Tensor.")
    shape = list(w.shape)
    _check(
        in_dim % block_size == 0,
        "input_dim should be divisible by block_size, "
        f"got input_dim: {in_dim}, block_size: {block_size}.",
    )
    _check(
        shape[0] == in_dim / block_size and shape[1] == block_size,
        "Weight shape is expected to be [input_dim / block_size, block_size, output_dim], "
        f"input_dim: {in_dim}, block_size: {block_size}, output_dim: {out_dim}, "
        f"but got {shape}.",
    )
    _check(scaler.dim() == 2, f"weight scaler is expected to be 2D, got {scaler.dim()}D Tensor.")
    _check(
        scaler.shape[0] == shape[0] and scaler.shape[1] == shape[-1],
        "weight scaler shape is expect to be [in_channel / block_size, out_channel], "
        f"got {scaler.shape}, weight shape {shape}.",
    )
    if zero_point is not None:
        _check(
            zero_point.dim() == 2,
            f"zero_point is expected to be 2D, got {zero_point.dim()}D Tensor.",
        )
        _check(
            zero_point.shape[0] == shape[0] and zero_point.shape[1] == shape[-1],
            "zero_point shape is expect to be [in_channel / block_size, out_channel], "
            f"got {zero_point.shape}, weight shape {shape}.",
        )


def _no_blockwise_activation(quantize_activation: bool) -> None:
    _check(
        not quantize_activation,
        "Blockwise quantization does not support activation quantization.",
    )


def _quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 quantization per row (last dim): the values and their scale."""
    scale = x.abs().amax(dim=-1, keepdim=True) / 127
    return torch.round(x / scale).to(torch.int8), scale.to(x.dtype)


def _blocks(x: torch.Tensor, block_size: int) -> torch.Tensor:
    return x.reshape(*x.shape[:-1], x.shape[-1] // block_size, block_size)


def _minus_zero_point(
    out: torch.Tensor, x: torch.Tensor, zero_point: Any, block_size: int
) -> torch.Tensor:
    if zero_point is None:
        return out
    if block_size == -1:
        return out - torch.einsum(_ZERO_POINT, x, zero_point)
    return out - torch.matmul(x.sum(dim=-1), zero_point)


def quantized_matmul(
    x: torch.Tensor,
    w: torch.Tensor,
    scaler: torch.Tensor,
    zero_point: torch.Tensor | None = None,
    block_size: int = -1,
    int4_weight: bool = False,
    quantize_activation: bool = False,
) -> torch.Tensor:
    """The host kernel: the weight dequantized to the activation's dtype."""
    x_scale = None
    if block_size == -1:
        _check_per_channel(x.shape[-1], scaler.shape[0], w, scaler, zero_point)
        w = w.to(x.dtype)
        if quantize_activation:
            x, x_scale = _quantize_rows(x)
            x, w = x.to(torch.int32), w.to(torch.int32)
        out = F.linear(x, w) * scaler
    else:
        _no_blockwise_activation(quantize_activation)
        _check_blockwise(x.shape[-1], w.shape[-1], block_size, w, scaler, zero_point)
        x = _blocks(x, block_size)
        out = torch.einsum(_SCALED_BLOCKS, scaler, torch.einsum(_PER_BLOCK, w.to(x.dtype), x))
    out = _minus_zero_point(out, x, zero_point, block_size)
    return out if x_scale is None else out * x_scale


def quantized_matmul_xla(
    x: torch.Tensor,
    w: torch.Tensor,
    scaler: torch.Tensor,
    zero_point: torch.Tensor | None = None,
    block_size: int = -1,
    int4_weight: bool = False,
    quantize_activation: bool = False,
) -> torch.Tensor:
    """The device kernel: the int8 (or int4) weight multiplied as it is."""
    if int4_weight:
        w = torch_xla._XLAC._xla_cast_int4(w, w.cpu().flatten().tolist())
    x_scale = None
    if block_size == -1:
        _check_per_channel(x.shape[-1], scaler.shape[0], w, scaler, zero_point)
        if quantize_activation:
            x, x_scale = _quantize_rows(x)
            out = torch_xla._XLAC._xla_dot_general(
                x, w, (([-1], [-1]), ()), preferred_element_type=torch.int32
            )
        else:
            out = _device_linear(x, w)
        out = out * scaler
    else:
        _no_blockwise_activation(quantize_activation)
        _check_blockwise(x.shape[-1], w.shape[-1], block_size, w, scaler, zero_point)
        x = _blocks(x, block_size)
        out = _device_scaled_blocks(scaler, _device_per_block(w, x))
    out = _device_minus_zero_point(out, x, zero_point, block_size)
    return out if x_scale is None else out * x_scale


# The device kernel runs below autograd, where composite ops such as linear and einsum reach
# the simulated tensors whole instead of as the products torch_xla lowers them to; the
# products are therefore spelled out as mm and bmm, whose result takes the first operand's
# dtype when the operands' dtypes differ, as torch_xla's dot does: the activation comes first,
# so the int8 weight's products stay in its dtype (torch_xla 2.9's kernel on CPU gives the
# host kernel's values).


def _device_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w.T`` over ``x``'s last dim."""
    rows = x.reshape(-1, x.shape[-1])
    return torch.mm(rows, w.t()).reshape(*x.shape[:-1], w.shape[0])


def _device_per_block(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``einsum("scn,...sc->...sn", w, x)``: one product per block ``s``."""
    lead = x.shape[:-2]
    s, c = x.shape[-2:]
    xs = x.reshape(-1, s, c).transpose(0, 1)  # [s, B, c]
    out = torch.bmm(xs, w)  # [s, B, n], in the activation's dtype (measured: not int8)
    return out.transpose(0, 1).reshape(*lead, s, w.shape[-1])


def _device_scaled_blocks(scaler: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``einsum("sn,...sn->...n", scaler, out)``: the blocks summed, weighted per column."""
    lead = out.shape[:-2]
    s, n = out.shape[-2:]
    per_column = out.reshape(-1, s, n).permute(2, 1, 0)  # [n, s, B]
    summed = torch.bmm(scaler.t().unsqueeze(1), per_column)  # [n, 1, B]
    return summed.reshape(n, -1).t().reshape(*lead, n)


def _device_minus_zero_point(
    out: torch.Tensor, x: torch.Tensor, zero_point: Any, block_size: int
) -> torch.Tensor:
    if zero_point is None:
        return out
    if block_size == -1:
        return out - x.sum(dim=-1, keepdim=True) * zero_point
    sums = x.sum(dim=-1)
    return out - _device_linear(sums, zero_point.t())


custom_ops.set_host_kernel("quantized_matmul", quantized_matmul)
custom_ops.set_device_kernel("quantized_matmul", quantized_matmul_xla)


class XlaQuantizedLinear(torch.nn.Module):
    """A Linear layer holding a quantized weight (buffers ``weight``, ``weight_scaler`` and,
    unless symmetric, ``zero_point``) that calls ``torch.ops.xla.quantized_matmul``."""

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        is_symmetric: bool = False,
        block_size: int = -1,
        int4_weight: bool = False,
        quantize_activation: bool = False,
    ) -> None:
        super().__init__()
        # the shapes, then how the weight is quantized, then whether the activation is too
        self.input_dim, self.output_dim = input_dim, output_dim
        self.is_symmetric, self.block_size, self.int4_weight = is_symmetric, block_size, int4_weight
        self.quantize_activation = quantize_activation
        self.register_buffer("weight", torch.zeros(output_dim, input_dim, dtype=torch.int8))
        self.register_buffer("weight_scaler", torch.zeros(output_dim))
        self.zero_point: torch.Tensor | None
        if is_symmetric:
            self.zero_point = None
        else:
            self.register_buffer("zero_point", torch.zeros(output_dim))

    def load_quantized_weight(
        self,
        weight: torch.Tensor,
        weight_scaler: torch.Tensor,
        zero_point: torch.Tensor | None = None,
    ) -> None:
        """Takes the quantized weight, its scaler and zero point (shapes as for the op)."""
        if self.block_size == -1:
            _check_per_channel(self.input_dim, self.output_dim, weight, weight_scaler, zero_point)
        else:
            _check_blockwise(
                self.input_dim, self.output_dim, self.block_size, weight, weight_scaler, zero_point
            )
        self.weight = weight
        self.weight_scaler = weight_scaler
        self.zero_point = zero_point

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        quantized = (self.weight, self.weight_scaler, self.zero_point)
        options = {
            "block_size": self.block_size,
            "int4_weight": self.int4_weight,
            "quantize_activation": self.quantize_activation,
        }
        return torch.ops.xla.quantized_matmul(x, *quantized, **options)
