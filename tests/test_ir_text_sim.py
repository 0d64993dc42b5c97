"""``_get_xla_tensors_text`` for pow by a Python number and floor_divide; the expected texts
were printed by real torch_xla 2.9 on CPU for the same programs."""

from __future__ import annotations

import pytest
import torch


def test_pow_by_a_number_is_a_constant_of_the_tensor_type(xlasim_sim):
    import torch_xla

    for exponent in (5, 2.5, 0):
        t = torch.pow(torch.tensor([2.0, 3.0], device="xla"), exponent)
        assert torch_xla._XLAC._get_xla_tensors_text([t]) == (
            "IR {\n"
            "  %0 = f32[] prim::Constant(), xla_shape=f32[]\n"
            "  %1 = f32[2]{0} xla::device_data(), xla_shape=f32[2]{0}\n"
            "  %2 = f32[2]{0} aten::pow(%1, %0), xla_shape=f32[2]{0}, ROOT=0\n"
            "}\n"
        )


def test_floor_divide_is_a_division_then_a_floor(xlasim_sim):
    import torch_xla

    a = torch.tensor([2, 3], dtype=torch.float64, device="xla")
    b = torch.tensor([2, 3], dtype=torch.float64, device="xla")
    assert torch_xla._XLAC._get_xla_tensors_text([torch.floor_divide(a, b)]) == (
        "IR {\n"
        "  %0 = f64[2]{0} xla::device_data(), xla_shape=f64[2]{0}\n"
        "  %1 = f64[2]{0} xla::device_data(), xla_shape=f64[2]{0}\n"
        "  %2 = f64[2]{0} aten::div(%1, %0), xla_shape=f64[2]{0}\n"
        "  %3 = f64[2]{0} aten::floor(%2), xla_shape=f64[2]{0}, ROOT=0\n"
        "}\n"
    )
    ints = torch.tensor([2, 3], device="xla")
    # Integer floor_divide casts through a floating type; that IR is not written.
    with pytest.raises(NotImplementedError, match=r"IR text of aten\.floor_divide"):
        torch_xla._XLAC._get_xla_tensors_text([torch.floor_divide(ints, ints)])


def test_legacy_bf16_shows_the_stored_type(xlasim_sim, monkeypatch):
    import torch_xla

    # torch_xla reads the variable when the first floating tensor is made on a device.
    monkeypatch.setenv("XLA_USE_BF16", "1")
    a = torch.tensor([2, 3], dtype=torch.float32, device="xla")
    b = torch.tensor([2, 3], dtype=torch.float32, device="xla")
    assert torch_xla._XLAC._get_xla_tensors_text([torch.floor_divide(a, b)]) == (
        "IR {\n"
        "  %0 = bf16[2]{0} xla::device_data(), xla_shape=bf16[2]{0}\n"
        "  %1 = bf16[2]{0} xla::device_data(), xla_shape=bf16[2]{0}\n"
        "  %2 = bf16[2]{0} aten::div(%1, %0), xla_shape=bf16[2]{0}\n"
        "  %3 = bf16[2]{0} aten::floor(%2), xla_shape=bf16[2]{0}, ROOT=0\n"
        "}\n"
    )
