"""``XLA_USE_32BIT_LONG``: int64 values wrap at 32 bits on the device and the IR shows s32;
values and texts as real torch_xla 2.9 on CPU gives them for the same program."""

from __future__ import annotations

import os

import torch


def test_longs_are_held_in_32_bits(xlasim_sim, monkeypatch, capfd):
    import torch_xla

    torch.ones(1, device="xla")  # a floating tensor first does not read the variable
    monkeypatch.setenv("XLA_USE_32BIT_LONG", "1")
    c = torch.tensor([2**31 + 5, -3], device="xla")
    assert c.dtype == torch.int64
    assert c.cpu().tolist() == [-2147483643, -3]
    assert (c * 2).cpu().tolist() == [10, -6]
    assert c.sum().cpu().item() == -2147483646
    assert torch.tensor([2**40], device="xla").cpu().tolist() == [0]
    assert "XLA Shape: s32[2]\n" in torch_xla._XLAC._get_xla_tensor_debug_info(c)
    assert torch_xla._XLAC._get_xla_tensors_text([c + c]) == (
        "IR {\n"
        "  %0 = s32[] prim::Constant(), xla_shape=s32[]\n"
        "  %1 = s32[2]{0} xla::device_data(), xla_shape=s32[2]{0}\n"
        "  %2 = s32[2]{0} aten::add(%1, %1, %0), xla_shape=s32[2]{0}, ROOT=0\n"
        "}\n"
    )
    assert "XLA_USE_32BIT_LONG will be deprecated after the 2.6 release\n" in capfd.readouterr().out


def test_read_at_the_first_long_tensor(xlasim_sim, monkeypatch):
    import torch_xla

    a = torch.tensor([1, 2], device="xla")
    monkeypatch.setenv("XLA_USE_32BIT_LONG", "1")
    assert os.environ["XLA_USE_32BIT_LONG"] == "1"
    b = torch.tensor([2**31 + 5], device="xla")
    assert b.cpu().tolist() == [2**31 + 5]  # read already: off
    assert "s64[2]{0} xla::device_data()" in torch_xla._XLAC._get_xla_tensors_text([a + a])
