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
    # A pending op's node (text as real torch_xla 2.9 on CPU writes it for an add).
    assert _info(pending).split("\n", 3)[3] == (
        "Device: TPU:0\nXLA Shape: f32[2,3]\nShardingSpec: None\nIR: [] aten::add, "
        "xla_shape=f32[2,3]{1,0}, dynamic_dims: ()\nXLAData: None\nTensor on host: None\n}\n"
    )
    with pytest.raises(NotImplementedError, match=r"a pending op's IR node .*aten.erf"):
        _info(moved.erf())
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


def test_cpu_tensor_is_not_an_xla_tensor(xlasim_sim):
    # real torch_xla 2.9 on CPU answers with this line for a CPU tensor
    assert _info(torch.ones(2)) == "Not a XLATensor\n"


def test_view_as_real_and_complex_nodes(xlasim_sim):
    # texts as real torch_xla 2.9 on CPU writes them; view_as_real keeps its operand's layout
    z = torch.randn(4, 3, dtype=torch.cfloat).to("xla")
    assert "IR: [] aten::view_as_real_copy, xla_shape=f32[4,3,2]{1,0}, dynamic_dims: ()\n" in (
        _info(torch.view_as_real(z))
    )
    y = torch.randn(4, 3, 2, dtype=torch.float64).to("xla")
    text = _info(torch.view_as_complex(y))
    assert "XLA Shape: c128[4,3]\n" in text
    assert "IR: [] aten::view_as_complex_copy, xla_shape=c128[4,3]{1,0}, dynamic_dims: ()\n" in (
        text
    )


def test_random_factory_nodes(xlasim_sim):
    # texts as real torch_xla 2.9 on CPU writes them for torch.randn / torch.rand on the device
    text = _info(torch.randn(5, 10, device="xla"))
    assert "IR: [] aten::normal, xla_shape=f32[5,10]{1,0}, dynamic_dims: ()\nXLAData: None\n" in (
        text
    )
    assert "IR: [] aten::uniform, xla_shape=f32[3]{0}, dynamic_dims: ()\n" in (
        _info(torch.rand(3, device="xla"))
    )
