"""``expand`` under ``XLA_DISABLE_FUNCTIONALIZATION=1``: torch_xla's own kernel checks the sizes.

Each message below was measured on real torch_xla 2.9 on CPU with the variable set; with it
unset PyTorch's checks fail first (``The expanded size of the tensor ...``)."""

from __future__ import annotations

import pytest
import torch

REFUSED = [
    (
        (1, 1, 2, 3),
        [-1, 3],
        "expand(): expected the `input` tensor f32[1,1,2,3] (rank: 4) to have a rank smaller "
        "or equal to the given `sizes` [-1, 3] (rank: 2).",
    ),
    (
        (1, 1, 2, 3),
        [1, 1, 1, 3],
        "expand(): expected dimension 2 of the given `sizes` [1, 1, 1, 3] (1) to be -1, or "
        "equal to the size of the `input` tensor f32[1,1,2,3] at dimension 2 (2).",
    ),
    (
        (2, 3),
        [5, 2, 4],
        "expand(): expected dimension 2 of the given `sizes` [5, 2, 4] (4) to be -1, or equal "
        "to the size of the `input` tensor f32[2,3] at dimension 1 (3).",
    ),
    ((2, 3), [-1, 2, 3], "Invalid dimension size -1, is_dynamic=false"),
    ((2, 1), [2, -2], "Invalid dimension size -2, is_dynamic=false"),
]

EXPANDED = [
    ((2, 3), [5, -1, 3], [5, 2, 3]),
    ((2, 1), [2, 7], [2, 7]),
    ((2, 3), [0, 2, 3], [0, 2, 3]),
]


@pytest.mark.topology("2x2x1", accelerator="v4")
@pytest.mark.parametrize(("shape", "sizes", "message"), REFUSED)
def test_expand_refusals_without_functionalization(xlasim_sim, monkeypatch, shape, sizes, message):
    import torch_xla

    monkeypatch.setenv("XLA_DISABLE_FUNCTIONALIZATION", "1")
    a = torch.rand(*shape, device=torch_xla.device())
    with pytest.raises(RuntimeError) as info:
        a.expand(sizes)
    assert str(info.value) == message


@pytest.mark.topology("2x2x1", accelerator="v4")
@pytest.mark.parametrize(("shape", "sizes", "result"), EXPANDED)
def test_expand_without_functionalization(xlasim_sim, monkeypatch, shape, sizes, result):
    import torch_xla

    monkeypatch.setenv("XLA_DISABLE_FUNCTIONALIZATION", "1")
    a = torch.rand(*shape, device=torch_xla.device())
    assert list(a.expand(sizes).shape) == result


@pytest.mark.topology("2x2x1", accelerator="v4")
def test_expand_with_functionalization_fails_in_pytorch(xlasim_sim, monkeypatch):
    import torch_xla

    monkeypatch.delenv("XLA_DISABLE_FUNCTIONALIZATION", raising=False)
    a = torch.rand(2, 3, device=torch_xla.device())
    with pytest.raises(RuntimeError, match="The expanded size of the tensor"):
        a.expand([2, 4])
