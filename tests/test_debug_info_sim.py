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


def test_a_step_barrier_turns_values_into_plain_data(xlasim_sim):
    import re

    import torch_xla

    moved = torch.randn(2, 3).to("xla")
    unused = torch.randn(4).to("xla")
    pending = moved + 1
    with pytest.raises(NotImplementedError, match=r"a pending op's IR node .*aten.add.Tensor"):
        _info(pending)
    torch_xla.sync()
    for t, shape in ((pending, "f32[2,3]"), (unused, "f32[4]"), (moved, "f32[2,3]")):
        body = re.sub(r"Data Handle: \d+", "Data Handle: H", _info(t).split("\n", 3)[3])
        assert body == (
            f"Device: TPU:0\nXLA Shape: {shape}\nShardingSpec: None\nIR: None\nXLAData: \n"
            f"  Data Device: TPU:0\n  Data Shape: {shape}\n  Data Handle: H\n"
            "Tensor on host: None\n}\n"
        )
    handle = re.search(r"Data Handle: (\d+)", _info(pending)).group(1)
    torch_xla.sync()
    assert f"Data Handle: {handle}\n" in _info(pending)  # the same data, the same handle


def test_factory_results_are_pending_ops(xlasim_sim):
    # as in torch_xla, a factory's result is an IR value until a sync
    with pytest.raises(NotImplementedError, match=r"pending op's IR node .*aten.zero_"):
        _info(torch.zeros(3, device="xla"))


def test_cpu_tensor_is_refused(xlasim_sim):
    with pytest.raises(RuntimeError, match="Expected XLA tensor"):
        _info(torch.ones(2))
