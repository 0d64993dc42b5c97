"""``_get_xla_tensors_hlo`` writes pending graphs only for the ops whose lowering it
reproduces; any other op raises NotImplementedError naming it instead of inventing text (the
texts it writes are checked against real torch_xla in ``conformance/test_hlo_text.py``)."""

from __future__ import annotations

import pytest
import torch


def test_an_op_without_a_reproduced_lowering_is_named(xlasim_sim):
    import torch_xla

    x = torch.ones(2, 2).to("xla")
    y = x.erf() + 1
    with pytest.raises(NotImplementedError, match=r"HLO text of pending ops like aten\.erf"):
        torch_xla._XLAC._get_xla_tensors_hlo([x, y])
    values, _ = torch.min(x, 1)
    with pytest.raises(NotImplementedError, match=r"aten\.min\.dim"):
        torch_xla._XLAC._get_xla_tensors_hlo([values])
    torch_xla.sync()
    assert torch_xla._XLAC._get_xla_tensors_hlo([y]) == ""  # executed: plain data


def test_other_dtypes_and_layouts_are_refused(xlasim_sim):
    import torch_xla

    h = torch.ones(2, 2, dtype=torch.bfloat16).to("xla")
    with pytest.raises(NotImplementedError, match=r"aten\.mul\.Tensor on bf16"):
        torch_xla._XLAC._get_xla_tensors_hlo([h * h])
    x = torch.ones(2, 3).to("xla")
    # Broadcasting ranks other than a scalar's is not reproduced.
    with pytest.raises(NotImplementedError, match=r"add broadcasting f32\[2,3\] with f32\[3\]"):
        torch_xla._XLAC._get_xla_tensors_hlo([x + torch.ones(3).to("xla")])


@pytest.mark.topology("2x2x1", accelerator="v4")
def test_custom_annotated_data_keeps_no_debug_text(xlasim_sim):
    import numpy as np
    import torch_xla
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    xr.use_spmd()
    mesh = xs.Mesh(np.arange(4), (1, 4))
    x = torch.ones(4, 4).to("xla")
    xs.mark_sharding(x, mesh, (0, 1))
    xs.annotate_custom_sharding(x, mesh, (1, 0))
    # Its HLO (the parameter under a custom-call Sharding) is written; the IR node's debug
    # text is not reproduced.
    assert 'custom_call_target="Sharding", sharding={devices=[4,1]0,1,2,3}' in (
        torch_xla._XLAC._get_xla_tensors_hlo([x])
    )
    with pytest.raises(NotImplementedError, match="pending op"):
        torch_xla._XLAC._get_xla_tensor_debug_info(x)


def test_a_scan_step_using_a_python_number_is_refused(xlasim_sim):
    import torch_xla
    from torch_xla.experimental.scan import scan

    # torch_xla passes a number other than 0 and 1 into the loop as a further ("hoisted")
    # device-data parameter of the step; that lowering is not reproduced.
    init, xs = torch.zeros(3).to("xla"), torch.ones(2, 3).to("xla")
    final, _ = scan(lambda c, x: (c + x * 3, None), init, xs)
    with pytest.raises(NotImplementedError, match="a scan step using a Python number"):
        torch_xla._XLAC._get_xla_tensors_hlo([final])
    final, _ = scan(lambda c, x: (c + x, None), init, xs)
    assert "while(" in torch_xla._XLAC._get_xla_tensors_hlo([final])
