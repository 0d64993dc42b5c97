"""``_get_xla_tensors_text`` of tensors holding data, as real torch_xla 2.9 writes it on CPU
(measured there): one ``xla::device_data`` node per tensor, a tensor given twice once with the
last position as its ROOT, and an empty graph for no tensors."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.topology("1x1", accelerator="v6e")


def test_device_data_text(xla_target):
    import torch
    import torch_xla

    device = torch_xla.device()
    a = torch.ones(2, 3, device=device)
    b = torch.zeros((), dtype=torch.bfloat16, device=device)
    torch_xla.sync()
    assert torch_xla._XLAC._get_xla_tensors_text([a, b, a]) == (
        "IR {\n"
        "  %0 = f32[2,3]{1,0} xla::device_data(), xla_shape=f32[2,3]{1,0}, ROOT=2\n"
        "  %1 = bf16[] xla::device_data(), xla_shape=bf16[], ROOT=1\n"
        "}\n"
    )
    moved = torch.ones(3).to(device)
    assert torch_xla._XLAC._get_xla_tensors_text([moved]) == (
        "IR {\n  %0 = f32[3]{0} xla::device_data(), xla_shape=f32[3]{0}, ROOT=0\n}\n"
    )
    assert torch_xla._XLAC._get_xla_tensors_text([]) == "IR {\n}\n"
