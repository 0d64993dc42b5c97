"""``_get_xla_tensors_hlo`` refuses the HLO of pending ops: their instructions come from
torch_xla's per-op lowering, which the simulator does not reproduce (the device-data graphs
it does write are checked against real torch_xla in ``conformance/test_hlo_text.py``)."""

from __future__ import annotations

import pytest
import torch


def test_pending_ops_are_not_written(xlasim_sim):
    import torch_xla

    x = torch.ones(2, 2).to("xla")
    y = x + 1
    with pytest.raises(NotImplementedError, match=r"HLO text of pending ops .*aten\.add"):
        torch_xla._XLAC._get_xla_tensors_hlo([x, y])
    torch_xla.sync()
    assert torch_xla._XLAC._get_xla_tensors_hlo([y]) == ""  # executed: plain data
