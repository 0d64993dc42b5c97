"""``torch_xla._XLAC._xla_dot_general``: XLA's DotGeneral on two xla tensors. Facts measured on
real torch_xla 2.9 with ``PJRT_DEVICE=CPU``: the result's dimensions are the batch ones, then
the left operand's free ones, then the right's; negative dimensions count from the end; int8
operands with ``preferred_element_type=torch.int32`` accumulate without wrapping; a CPU operand
is refused with the message below (upstream's quantized_ops/test_dot_general.py, TPU CI)."""

from __future__ import annotations

import pytest
import torch

import xlasim


def test_dot_general_dimension_order_dtypes_and_errors():
    with xlasim.simulate("2x2x1", "v4"):
        import torch_xla

        dev = torch_xla.device()
        # small integers: exact at any mat-mul precision, so the TPU's default one will do
        x = torch.randint(-4, 4, (2, 3, 6, 4)).float()  # batch 0, contracting 3
        w = torch.randint(-4, 4, (5, 4, 2)).float()  # batch 2, contracting 1
        dims = (([3], [1]), ([0], [2]))
        out = torch_xla._XLAC._xla_dot_general(x.to(dev), w.to(dev), dims)
        assert out.shape == (2, 3, 6, 5) and out.dtype == torch.float32
        assert torch.equal(out.cpu(), torch.einsum("bmnk,fkb->bmnf", x, w))
        negative = torch_xla._XLAC._xla_dot_general(
            x.to(dev), w.to(dev), (([-1], [-2]), ([0], [-1]))
        )
        assert torch.equal(negative.cpu(), out.cpu())

        ones = torch.full((2, 64), 100, dtype=torch.int8)
        many = torch.full((64, 3), 100, dtype=torch.int8)
        wide = torch_xla._XLAC._xla_dot_general(
            ones.to(dev), many.to(dev), (([1], [0]), ()), preferred_element_type=torch.int32
        )
        assert wide.dtype == torch.int32 and wide.cpu().tolist() == [[640000] * 3] * 2

        message = (
            "Expected input tensor (second argument) to be an actual XLA tensor. Got: "
            "torch.FloatTensor. Consider moving it (second argument) to XLA."
        )
        with pytest.raises(RuntimeError) as info:
            torch_xla._XLAC._xla_dot_general(x.to(dev), w, dims)
        assert str(info.value) == message
