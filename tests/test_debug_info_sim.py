"""``_get_xla_tensor_debug_info`` on the simulator outside SPMD, and the states it does not
write (they raise NotImplementedError instead of inventing torch_xla's IR text).

The non-SPMD text is real torch_xla 2.9's on PJRT CPU (``Device: CPU:0`` there; a simulated
TPU slice names its own device), read in a fresh process: the conformance suite's real
process turns SPMD on for good.
"""

from __future__ import annotations

import pytest
import torch


def _info(t):
    import torch_xla

    return torch_xla._XLAC._get_xla_tensor_debug_info(t)


def test_moved_data_is_a_device_data_value(xlasim_sim):
    t = torch.tensor(3.0).to("xla")
    text = _info(t)
    body = text.split("\n", 3)[3]  # after the two ids
    assert body == (
        "Device: TPU:0\nXLA Shape: f32[]\nShardingSpec: None\nIR: [UNKNOWN_SCALAR[]] "
        "xla::device_data, xla_shape=f32[], dynamic_dims: (), device=TPU:0\nXLAData: None\n"
        "Tensor on host: None\n}\n"
    )
    # not deferred outside SPMD: the upload happened at .to()
    import torch_xla.debug.metrics as met

    assert met.metric_data("TransferToDeviceTime")[0] == 1


def test_unsimulated_states_raise(xlasim_sim):
    import torch_xla

    t = torch.randn(2, 3).to("xla")
    pending = t + 1
    with pytest.raises(NotImplementedError, match="IR text of a pending op .*aten.add.Tensor"):
        _info(pending)
    torch_xla.sync()
    for synced in (t, pending):
        with pytest.raises(NotImplementedError, match="passed through a step barrier"):
            _info(synced)


def test_cpu_tensor_is_refused(xlasim_sim):
    with pytest.raises(RuntimeError, match="Expected XLA tensor"):
        _info(torch.ones(2))
