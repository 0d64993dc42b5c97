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


@pytest.mark.topology("2x2x1", accelerator="v4")
def test_custom_annotated_data_is_not_written_as_a_parameter(xlasim_sim):
    import numpy as np
    import torch_xla
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    xr.use_spmd()
    mesh = xs.Mesh(np.arange(4), (1, 4))
    x = torch.ones(4, 4).to("xla")
    xs.mark_sharding(x, mesh, (0, 1))
    # torch_xla lowers it as the parameter under a custom-call Sharding: not a parameter with
    # the new sharding, which is all the simulator could write.
    xs.annotate_custom_sharding(x, mesh, (1, 0))
    with pytest.raises(NotImplementedError, match="annotate_custom_sharding"):
        torch_xla._XLAC._get_xla_tensors_hlo([x])
    with pytest.raises(NotImplementedError, match="annotate_custom_sharding"):
        torch_xla._XLAC._get_xla_tensor_debug_info(x)
