"""How xla tensors print: ``repr``/``str`` and ``format`` (f-strings), as real torch_xla 2.9.

torch formats a 0-dim plain tensor as its Python value (``f"{loss}"`` prints ``7.52...``, and a
format spec applies to the value); a tensor with dimensions or a Parameter prints its text and
refuses a format spec. The device is the first suffix after the data.
"""

from __future__ import annotations

import pytest
import torch


def test_zero_dim_tensor_formats_as_its_value(xla_target):
    import torch_xla

    dev = torch_xla.device()
    loss = torch.tensor(7.521758556365967).to(dev) * 1
    assert f"{loss}" == "7.521758556365967"
    assert f"{loss:.2f}" == "7.52"
    assert f"{torch.tensor(3).to(dev)}" == "3"
    assert f"{torch.tensor(True).to(dev)}" == "True"
    assert format(torch.tensor(1.5, dtype=torch.float16).to(dev), ".3f") == "1.500"


def test_tensor_text(xla_target):
    import torch_xla

    dev = torch_xla.device()
    cases = {
        "tensor([0., 1., 2., 3.], device='xla:0')": torch.arange(4.0).to(dev),
        "tensor([], device='xla:0', size=(2, 0))": torch.zeros(2, 0).to(dev),
        "tensor([1., 1.], device='xla:0', dtype=torch.bfloat16)": torch.ones(
            2, dtype=torch.bfloat16
        ).to(dev),
        "tensor([2., 2.], device='xla:0', grad_fn=<MulBackward0>)": (
            torch.ones(2, device=dev, requires_grad=True) * 2
        ),
        "Parameter containing:\ntensor([1., 1.], device='xla:0', requires_grad=True)": (
            torch.nn.Parameter(torch.ones(2).to(dev))
        ),
    }
    for expected, t in cases.items():
        assert repr(t) == expected
        assert str(t) == expected
        assert f"{t}" == expected
    # A 0-dim tensor's text carries its dtype after the device; f-strings give its value.
    scalar = torch.tensor(3.0, dtype=torch.float64).to(dev)
    assert repr(scalar) == str(scalar) == "tensor(3., device='xla:0', dtype=torch.float64)"
    assert f"{scalar}" == "3.0"
    big = repr(torch.arange(2000.0).to(dev))
    # Summarized, wrapped, the continuation indented under "tensor(" and the device after "]".
    assert big.splitlines() == [
        "tensor([0.0000e+00, 1.0000e+00, 2.0000e+00,  ..., 1.9970e+03, 1.9980e+03,",
        "        1.9990e+03], device='xla:0')",
    ]
    with pytest.raises(TypeError, match=r"unsupported format string passed to Tensor.__format__"):
        format(torch.arange(4.0).to(dev), ".2f")
    param = torch.nn.Parameter(torch.tensor(2.0).to(dev))
    with pytest.raises(
        TypeError, match=r"unsupported format string passed to Parameter.__format__"
    ):
        format(param, ".2f")
