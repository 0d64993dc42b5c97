"""``_get_xla_tensors_text`` of ``addcdiv``/``addcmul``: each expected text was printed by real
torch_xla 2.9 on CPU for the same program."""

from __future__ import annotations

import pytest
import torch


def _text(op_name: str, value: str, root: str) -> str:
    data = "f32[2,2]{1,0} xla::device_data(), xla_shape=f32[2,2]{1,0}"
    return (
        "IR {\n"
        f"  %0 = {value}\n"
        f"  %1 = {data}\n  %2 = {data}\n  %3 = {data}\n"
        f"  %4 = f32[2,2]{{1,0}} aten::{op_name}(%3, %2, %1, %0), xla_shape=f32[2,2]{{1,0}}, "
        f"ROOT={root}\n"
        "}\n"
    )


F64_CONSTANT = "f64[] prim::Constant(), xla_shape=f64[]"
CASES = [
    ("addcmul", {"value": 2.0}, "f64[] xla::device_data(), xla_shape=f64[]"),
    ("addcmul", {"value": -1.0}, F64_CONSTANT),
    ("addcmul", {"value": 0.0}, F64_CONSTANT),
    ("addcdiv", {"value": 1.0}, F64_CONSTANT),
    ("addcmul", {"value": 1}, "s64[] prim::Constant(), xla_shape=s64[]"),
    ("addcdiv", {}, "s64[] prim::Constant(), xla_shape=s64[]"),
]


@pytest.mark.topology("2x2x1", accelerator="v4")
@pytest.mark.parametrize(("op_name", "kwargs", "value"), CASES)
def test_addc_ir_text(xlasim_sim, op_name, kwargs, value):
    import torch_xla

    a, b, c = (torch.rand(2, 2).to("xla") for _ in range(3))
    out = getattr(torch, op_name)(a, b, c, **kwargs)
    assert torch_xla._XLAC._get_xla_tensors_text([out]) == _text(op_name, value, "0")


@pytest.mark.topology("2x2x1", accelerator="v4")
def test_addc_ir_text_of_a_cast_operand_is_not_invented(xlasim_sim):
    # Real torch_xla writes an xla::cast node for the bfloat16 copy; the simulator does not.
    import torch_xla

    a = torch.rand(2, 2).to("xla").to(torch.bfloat16)
    with pytest.raises(NotImplementedError, match="IR text"):
        torch_xla._XLAC._get_xla_tensors_text([torch.addcdiv(a, a, a)])
