"""Manual sharding on the simulator: what it refuses instead of guessing.

Inside a manual region each device holds its own value; the simulator runs every op once per
device. What it cannot reproduce faithfully raises NotImplementedError naming it (real
torch_xla aborts the process when a manual tensor is read back; the values it behaves with
are in ``conformance/test_spmd_manual_sharding.py``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch


def _manual_columns():
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    xr.use_spmd()
    mesh = xs.Mesh(np.arange(4), (1, 4))
    xs.set_global_mesh(mesh)
    x = torch.arange(16.0).reshape(4, 4).to("xla")
    return mesh, xs.enable_manual_sharding(x, (None, 1)).global_tensor


@pytest.mark.topology("2x2x1", accelerator="v4")
def test_reading_a_manual_tensor_back_is_refused(xlasim_sim):
    _mesh, manual = _manual_columns()
    with pytest.raises(NotImplementedError, match="manual-sharded tensor between the host"):
        manual.cpu()
    with pytest.raises(NotImplementedError, match="manual-sharded tensor between the host"):
        manual.sum().item()


@pytest.mark.topology("2x2x1", accelerator="v4")
def test_ops_run_per_device_and_refuse_tiled_partners(xlasim_sim):
    import torch_xla.distributed.spmd as xs

    _mesh, manual = _manual_columns()
    # Views, in-place updates and multi-output ops keep one value per device.
    doubled = manual.view(4, 1)
    doubled.mul_(2)
    top, index = torch.max(doubled, dim=0, keepdim=True)
    assert index.dtype == torch.int64
    full = xs.disable_manual_sharding(top, (None, 1), (1, 4)).global_tensor
    assert torch.equal(full.cpu(), torch.tensor([[24.0, 26.0, 28.0, 30.0]]))
    rows = xs.Mesh(np.arange(4), (4, 1))
    tiled = xs.mark_sharding(torch.ones(4, 1).to("xla"), rows, (0, None)).global_tensor
    with pytest.raises(NotImplementedError, match=r"sharded \{devices=\[4,1\]0,1,2,3\}"):
        manual + tiled
    replicated = torch.ones(4, 1).to("xla")
    with pytest.raises(NotImplementedError, match="not manual-sharded"):
        replicated.add_(manual)
    with pytest.raises(NotImplementedError, match="random op"):
        torch.nn.functional.dropout(manual, 0.5)
