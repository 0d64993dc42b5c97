"""Bounded dynamic dimensions under ``XLA_EXPERIMENTAL=nonzero:masked_select``.

Every expected value here was measured on real torch_xla 2.9 on CPU with the same program
(``XLA_EXPERIMENTAL=nonzero:masked_select:masked_scatter:nms PJRT_DEVICE=CPU``), the error
texts included; without the variable the ops keep their static shapes (CPU fallback).
"""

from __future__ import annotations

import pytest
import torch

EXPERIMENTS = "nonzero:masked_select:masked_scatter:nms"


@pytest.fixture
def dynamic(xlasim_sim, monkeypatch):
    monkeypatch.setenv("XLA_EXPERIMENTAL", EXPERIMENTS)
    import torch_xla.debug.metrics as met

    met.clear_all()
    return met


def _nonzero_of_one():
    t = torch.zeros([5, 2], device="xla")
    t[3][0] = 1
    return torch.nonzero(t)  # [<=10, 2], real [1, 2]


def test_nonzero_has_a_bounded_first_dimension(dynamic):
    t = _nonzero_of_one()
    # Making it ran the graph of its size once (one compile, one execution).
    assert dynamic.metric_data("CompileTime")[0] == 1
    assert dynamic.metric_data("ExecuteTime")[0] == 1
    assert str(t.shape) == "torch.Size([<=10, 2])"
    assert isinstance(t.shape[0], torch.SymInt) and isinstance(t.shape[1], int)
    assert int(t.shape[0]) == 1 and t.shape[0] == 1
    assert t.dtype == torch.int32  # torch_xla 2.9's index type on CPU
    assert str(t.numel()) == "<=20"
    assert dynamic.metric_data("CompileTime")[0] == 1  # reading sizes runs nothing more
    assert t.cpu().tolist() == [[3, 0]]


def test_masked_select_keeps_the_dtype(dynamic):
    import torch_xla

    x = torch.tensor((0, 1, 2, 0, 3, 4), device="xla")
    m = torch.masked_select(x, x.ge(2))
    assert str(m.shape) == "torch.Size([<=6])" and m.dtype == torch.int64
    assert m.cpu().tolist() == [2, 3, 4]
    size = torch_xla._XLAC._get_xla_tensor_dimension_size(m, 0)
    assert size.dtype == torch.int32 and size.item() == 3


def test_size_arithmetic(dynamic):
    t = _nonzero_of_one()
    s = t.shape[0]
    assert (str(s + 3), int(s + 3)) == ("<=13", 4)
    assert (str(s + t.shape[1]), int(s + t.shape[1])) == ("<=12", 3)
    assert (str(s - t.shape[1]), int(s - t.shape[1])) == ("<=8", -1)
    assert (str(s % t.shape[1]), int(s % t.shape[1])) == ("<=0", 1)
    assert (str(torch.sym_max(s, 2)), int(torch.sym_max(s, 2))) == ("<=10", 2)
    assert int(torch.sym_min(s, 2)) == 1
    assert isinstance(s >= 2, torch.SymBool) and int(s >= 2) == 0 and bool(s < 2)
    with pytest.raises(
        RuntimeError, match="^Comparison operators should be using getDynamicValue$"
    ):
        str(s == 1)
    for name in ("add", "sub", "mod", "sym_max", "sym_min", "ge", "lt", "eq"):
        assert dynamic.counter_value(f"xla::size_{name}") > 0, name


def test_ops_keep_the_dynamic_dimension(dynamic):
    t1 = torch.tensor([[1, 0, 0, 5, 0, 6], [1, 3, 2, 0, 0, 1]], device="xla")
    t2 = torch.nonzero(t1)  # [<=12, 2], real [7, 2]
    assert str(torch.t(t2).shape) == "torch.Size([2, <=12])"
    assert str(torch.unsqueeze(t2, 0).shape) == "torch.Size([1, <=12, 2])"
    assert str(torch.abs(t2).shape) == "torch.Size([<=12, 2])"
    added = t2 + torch.tensor([[1, 1]], device="xla")
    assert str(added.shape) == "torch.Size([<=12, 2])" and int(added.shape[0]) == 7
    assert torch.equal(added.cpu(), torch.nonzero(t1.cpu()) + 1)
    e = torch.ones(1, device="xla").expand(t2.shape[0])
    assert str(e.shape) == "torch.Size([<=12])" and e.cpu().tolist() == [1.0] * 7
    made = torch.empty(t2.shape, dtype=torch.int32, device="xla")
    assert str(made.shape) == "torch.Size([<=12, 2])" and made.cpu().shape == (7, 2)


def test_refusals_word_as_torch_xla(dynamic):
    t2 = torch.nonzero(torch.tensor([[1, 0, 3, 5, 0, 6]], device="xla"))  # [<=6, 2], real 4
    t4 = torch.nonzero(torch.tensor([[1]], device="xla"))
    with pytest.raises(RuntimeError) as both:
        torch.add(t2, t4)
    assert str(both.value) == (
        "Check failed: !(tensor_has_dym_dim(self) && tensor_has_dym_dim(other)): Both operands "
        "of torch.add cannot have dynamic dimensions at the same time. This is not supported "
        "in PyTorch/XLA."
    )
    with pytest.raises(RuntimeError) as misfit:
        torch.add(t2, torch.tensor([[1, 1], [1, 1]], device="xla"))
    assert str(misfit.value) == (
        "Shapes are not compatible for broadcasting: s64[<=6,2] vs. s64[2,2]. Expected "
        "dimension 0 of shape s64[<=6,2] (6) to match dimension 0 of shape s64[2,2] (2). "
        "Either that or that any of them is either 1 or unbounded. Try reshaping one of the "
        "tensors to match the other."
    )
    a = torch.nonzero(torch.tensor([1, 1, 3, 5, 1, 6], device="xla"))
    with pytest.raises(RuntimeError, match=r"This view op has dynamic input tensor but static"):
        a.view(2, 3)
    b = torch.nonzero(torch.tensor([1, 0, 3, 5, 0, 6], device="xla"))  # [<=6, 1], real 4
    with pytest.raises(RuntimeError) as static:
        torch.ones((2, 2), device="xla").view(b.shape[0])
    assert str(static.value) == (
        "Check failed: total_element_count == runtime::util::Multiply<int64_t>(output_sizes) "
        "(4 vs. 6)(6) vs. (2, 2)"
    )
    with pytest.raises(RuntimeError) as real:
        torch.ones((2, 3), device="xla").view(b.shape[0])
    assert str(real.value) == "shape '[<=6]' is invalid for input of size 6"
    c = torch.nonzero(torch.tensor([1, 0, 3, 5, 0, 6, 7], device="xla"))
    with pytest.raises(RuntimeError, match=r"^shape '\[<=7\]' is invalid for input of size <=6$"):
        b.view(c.shape[0])


def test_static_without_the_variable(xlasim_sim, monkeypatch):
    import torch_xla.debug.metrics as met

    monkeypatch.delenv("XLA_EXPERIMENTAL", raising=False)
    t = torch.nonzero(torch.tensor([1, 0, 3], device="xla"))
    assert t.shape == (2, 1) and isinstance(t.shape[0], int) and t.dtype == torch.int64
    assert "aten::nonzero" in met.executed_fallback_ops()


def test_ir_text_writes_the_bounds(dynamic):
    import torch_xla

    x = torch.tensor([1, 0, 3, 5, 0, 6], device="xla")
    n = torch.nonzero(x)
    assert torch_xla._XLAC._get_xla_tensors_text([n]) == (
        "IR {\n"
        "  %0 = s64[6]{0} xla::device_data(), xla_shape=s64[6]{0}\n"
        "  %1 = (s32[<=6,1]{1,0}, s32[]) aten::nonzero(%0), num_outputs=2, "
        "xla_shape=(s32[<=6,1]{1,0}, s32[]), ROOT=0\n"
        "}\n"
    )
    mask = torch.tensor([True, False, True, True, False, False], device="xla")
    assert torch_xla._XLAC._get_xla_tensors_text([torch.masked_select(x, mask)]) == (
        "IR {\n"
        "  %0 = pred[6]{0} xla::device_data(), xla_shape=pred[6]{0}\n"
        "  %1 = s64[6]{0} xla::device_data(), xla_shape=s64[6]{0}\n"
        "  %2 = (s64[<=6]{0}, s32[]) aten::masked_select(%1, %0), num_outputs=2, "
        "xla_shape=(s64[<=6]{0}, s32[]), ROOT=0\n"
        "}\n"
    )
    torch_xla.sync()
    assert torch_xla._XLAC._get_xla_tensors_text([n]) == (
        "IR {\n  %0 = s32[<=6,1]{1,0} xla::device_data(), xla_shape=s32[<=6,1]{1,0}, ROOT=0\n}\n"
    )
    # A synced dynamic tensor is an input of later graphs like any other.
    assert int((n * 2).cpu().sum()) == 2 * (0 + 2 + 3 + 5)
