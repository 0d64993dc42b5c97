"""Error types and messages as real torch_xla 2.9 raises them (each checked on real PJRT CPU)."""

from __future__ import annotations

import re
import socket
from datetime import timedelta

import pytest
import torch
from messages import check_hint, raises_torch_xla


def test_python_api_errors(xla_target):
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.xla_multiprocessing as xmp

    n_local = xla_target.devices_per_host
    devices = [f"xla:{i}" for i in range(n_local)]
    # torch_xla.device() checks `index > len(devices)`, so index == len falls through to the list
    with pytest.raises(IndexError, match=r"^list index out of range$"):
        torch_xla.device(n_local)
    message = f"Device index {n_local + 1} out of range in {devices!r}"
    with pytest.raises(IndexError, match=f"^{re.escape(message)}$"):
        torch_xla.device(n_local + 1)
    with pytest.raises(RuntimeError, match=r"^Invalid device format: cpu$"):
        xm.xla_device_hw("cpu")
    with pytest.raises(TypeError, match=r"^`payload` must be bytes, not <class 'int'>$"):
        xm.rendezvous("tag", 5)
    with pytest.raises(
        ValueError,
        match=r"^Unsupported nprocs \(2\)\. Please use nprocs=1 or "
        r"None \(default\)\.",
    ):
        xmp.spawn(lambda index: None, nprocs=2)
    t = torch.ones(3, device=torch_xla.device())
    with pytest.raises(
        TypeError,
        match=r"^can't convert xla:0 device type tensor to numpy\. "
        r"Use Tensor\.cpu\(\) to copy the tensor to host memory first\.$",
    ):
        t.numpy()
    with pytest.raises(
        RuntimeError,
        match=r"^a Tensor with 3 elements cannot be converted to "
        r"Scalar$",
    ):
        t.item()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_spmd_mode_errors(xla_target, monkeypatch):
    import torch.distributed as dist
    import torch_xla
    import torch_xla.runtime as xr

    # the xla:// handler opens its TCPStore before the backend refuses SPMD; keep it off the
    # default port 12355, which other processes on a shared machine may hold
    monkeypatch.setenv("MASTER_ADDR", "localhost")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    xr.use_spmd()
    with pytest.raises(
        NotImplementedError,
        match=r"^launch function does not support SPMD at "
        r"this time$",
    ):
        torch_xla.launch(lambda: None)
    if xla_target.num_hosts > 1:
        # Under SPMD the xla:// store waits for one process per host: with this host alone
        # it would block (on real TPU as in the simulator) before the backend check is reached.
        return
    with pytest.raises(
        AssertionError,
        match=r"^XLA backend is not supported with SPMD\. Please "
        r"use a CPU process group instead\.$",
    ):
        dist.init_process_group("xla", init_method="xla://", timeout=timedelta(seconds=60))
    assert not dist.is_initialized()


def test_shape_errors_name_xla_shapes(xla_target):
    """Shape errors are raised when the op is traced, in XLA's words (f32[2,3]), not eager's."""
    import torch_xla

    dev = torch_xla.device()
    a = torch.ones(2, 3, device=dev)
    with pytest.raises(
        RuntimeError,
        match=r"^mm\(\): cannot matrix-multiply tensors f32\[2,3\] "
        r"and f32\[2,3\]\. Expected the size of dimension 1 of the first input "
        r"tensor \(3\) to be equal the size of dimension 0 of the second input "
        r"tensor \(2\)\.$",
    ):
        a @ a
    with pytest.raises(
        RuntimeError,
        match=r"^Shapes are not compatible for broadcasting: "
        r"f32\[2,3\] vs\. f32\[4\]\.",
    ):
        a + torch.ones(4, device=dev)


def test_errors_keep_torch_xla_text_and_hint_in_a_note(xla_target):
    """``str(e)`` and ``e.args`` are real torch_xla's text, exactly (checked on real PJRT CPU);
    the simulator's hint (which argument, which devices exist) is a note under the traceback."""
    import torch_xla

    dev = torch_xla.device()
    a = torch.ones(2, 2, device=dev)
    cpu = torch.ones(2, 2)
    cases = [
        (
            lambda: torch.cat([a, cpu]),
            "Expected all tensors in the given list to be XLA tensors. Element at index 1 is "
            "not an XLA tensor. Got: torch.FloatTensor",
            ("argument 'tensors[1]' of aten::cat", "to(torch_xla.device())"),
        ),
        (
            lambda: torch.mm(a, cpu),
            "Expected XLA tensor. Got: torch.FloatTensor",
            ("argument 'mat2' of aten::mm is a cpu tensor of shape [2, 2]",),
        ),
        (
            lambda: torch.zeros(2, device="xla:99"),
            "vector::_M_range_check: __n (which is 99) >= this->size() "
            f"(which is {xla_target.devices_per_host})",
            ("device xla:99 does not exist", f"xla:0..xla:{xla_target.devices_per_host - 1}"),
        ),
        (
            lambda: torch_xla._XLAC.OpSharding([0], (), [], 1),
            "__init__(): incompatible constructor arguments. The following argument types are "
            "supported:\n    1. _XLAC.OpSharding(arg0: list, arg1: list, arg2: list, "
            "arg3: typing.SupportsInt)\n\nInvoked with: [0], (), [], 1",
            ("group_assignment is a tuple, not a list",),
        ),
    ]
    for call, message, hint in cases:
        kind = TypeError if message.startswith("__init__") else RuntimeError
        with raises_torch_xla(kind, message) as info:
            call()
        assert info.value.args == (message,)
        check_hint(info.value, xla_target, *hint)
