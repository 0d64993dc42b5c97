"""Argument checks torch_xla 2.9 makes in its own kernels, with its messages (each checked on
real torch_xla 2.9, PJRT CPU; the cases differ from those pytorch/xla's test_ops_error_message.py
pins: other dtypes, the second operand, negative dimensions, in-place variants)."""

from __future__ import annotations

import re

import pytest
import torch


def _raises(message: str):
    return pytest.raises(RuntimeError, match=f"^{re.escape(message)}$")


def test_matrix_and_rounding_mode_checks(xla_target):
    import torch_xla

    device = torch_xla.device()
    a = torch.rand(3, 2, device=device)
    with _raises(
        "mm(): expected the second input tensor f32[2] to be a matrix (i.e. a 2D tensor)."
    ):
        torch.mm(a, torch.rand(2, device=device))
    with _raises("trace(): expected the input tensor f32[3] to be a matrix (i.e. a 2D tensor)."):
        torch.trace(torch.rand(3, device=device))
    with _raises(
        "div(): invalid rounding mode `round`. Expected it to be either 'trunc', 'floor', or be "
        "left unspecified."
    ):
        torch.div(a, a, rounding_mode="round")
    # in place, torch's Python reference of div answers (a ValueError)
    with pytest.raises(ValueError, match=r"^div expected rounding_mode .* but found round\.$"):
        a.div_(2, rounding_mode="round")
    # the checks pass: the ops compute
    assert torch.mm(a, torch.ones(2, 1, device=device)).shape == (3, 1)
    assert torch.div(a, 2, rounding_mode="floor").cpu().max().item() == 0.0


def test_shape_argument_checks(xla_target):
    import torch_xla

    device = torch_xla.device()
    x = torch.rand(2, 3, 4, device=device)
    with _raises(
        "flip(): expected each dimension to appear at most once. Found dimensions: 2 (2 times). "
        "Consider changing dims from [-1, 2, 0] to [0, 2]."
    ):
        torch.flip(x, dims=[-1, 2, 0])
    with _raises(
        "roll(): expected `dims` [0, 1, 2] (size=3) to match the size of `shifts` [1] (size=1)."
    ):
        torch.roll(x, [1], [0, 1, 2])
    with _raises(
        "full(): expected concrete sizes (i.e. non-symbolic) to be positive values. However found "
        "negative ones: [-1, -3]."
    ):
        torch.full((-1, -3), 2, device=device)
    index = torch.zeros(2, 4, 5, dtype=torch.int64, device=device)
    with _raises(
        "gather(): expected sizes of index [2, 4, 5] to be smaller or equal those of input "
        "[2, 3, 4] on all dimensions, except on dimension 2. However, that's not true on "
        "dimensions [1]."
    ):
        torch.gather(x, -1, index)
    with _raises(
        "Shapes are not compatible for broadcasting: f32[2,3,4] vs. f32[5,4]. Expected dimension "
        "1 of shape f32[2,3,4] (3) to match dimension 0 of shape f32[5,4] (5). Either that or that "
        "any of them is either 1 or unbounded. Try reshaping one of the tensors to match the other."
    ):
        x + torch.rand(5, 4, device=device)
    assert torch.full((2, 2), 7, device=device).dtype == torch.int64


def test_random_range_checks(xla_target):
    import torch_xla

    t = torch.empty(4, dtype=torch.int8, device=torch_xla.device())
    with _raises(
        "random_(): expected `from` to be within the range [-128, 127]. However got value -129, "
        "which is lower than the lower bound."
    ):
        t.random_(-129, 0)
    with _raises(
        "random_(): expected `to` to be within the range [-128, 127]. However got value 199, "
        "which is greater than the upper bound."
    ):
        t.random_(200)
    with _raises("random_(): expected `from` (5) to be smaller than `to` (5)."):
        t.random_(5, 5)
    values = t.random_(-3, 3).cpu()
    assert values.min().item() >= -3 and values.max().item() < 3
