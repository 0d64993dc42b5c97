"""torch_xla.core.xla_model in one process (world size 1), as real torch_xla 2.9 behaves."""

from __future__ import annotations

import io
import warnings

import pytest
import torch


def test_deprecated_xla_device_and_mark_step(xla_target):
    import torch_xla
    import torch_xla.core.xla_model as xm

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dev = xm.xla_device()
        t = torch.ones(2, device=dev) * 2
        xm.mark_step()
    assert [(w.category, str(w.message)) for w in caught] == [
        (DeprecationWarning, "Use torch_xla.device instead"),
        (DeprecationWarning, "Use torch_xla.sync instead"),
    ]
    # typing_extensions.deprecated points the warning at the caller
    assert {w.filename for w in caught} == {__file__}
    assert dev == torch_xla.device() == torch.device("xla:0")
    assert t.cpu().tolist() == [2.0, 2.0]


def test_device_helpers(xla_target):
    import torch_xla
    import torch_xla.core.xla_model as xm

    n_local = xla_target.devices_per_host
    dev = torch_xla.device()
    assert xm.xla_device_hw(dev) == xla_target.device_type
    assert xm.xla_device_hw("xla:0") == xla_target.device_type
    assert xm.get_xla_supported_devices() == [f"xla:{i}" for i in range(n_local)]
    assert xm.get_xla_supported_devices(max_devices=1) == ["xla:0"]
    assert xm.is_xla_tensor(torch.ones(1, device=dev))
    assert not xm.is_xla_tensor(torch.ones(1))
    assert xm.is_master_ordinal()
    assert xm.is_master_ordinal(local=False) == (xla_target.host_index == 0)
    assert xm.get_local_ordinal() == 0
    out = io.StringIO()
    xm.master_print("hello", 42, fd=out)
    assert out.getvalue() == "hello 42\n"
    assert (
        xm.REDUCE_SUM,
        xm.REDUCE_MUL,
        xm.REDUCE_AND,
        xm.REDUCE_OR,
        xm.REDUCE_MIN,
        xm.REDUCE_MAX,
    ) == ("sum", "mul", "and", "or", "min", "max")


def test_single_process_collectives(xla_target):
    import torch_xla
    import torch_xla.core.xla_model as xm

    dev = torch_xla.device()
    t = torch.arange(4.0, device=dev)
    # world size 1: all_reduce returns a clone and does NOT apply `scale`
    reduced = xm.all_reduce(xm.REDUCE_SUM, t, scale=0.5)
    assert reduced is not t
    assert reduced.device == dev
    assert reduced.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    reduced_list = xm.all_reduce(xm.REDUCE_MAX, [t, t * 2], scale=3.0)
    assert isinstance(reduced_list, list)
    assert [r.cpu().tolist() for r in reduced_list] == [[0.0, 1.0, 2.0, 3.0], [0.0, 2.0, 4.0, 6.0]]
    gathered = xm.all_gather(t)
    assert gathered is not t
    assert gathered.shape == (4,)
    assert gathered.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    gathered = xm.all_gather(t.reshape(2, 2), dim=1)
    assert gathered.cpu().tolist() == [[0.0, 1.0], [2.0, 3.0]]
    assert xm.rendezvous("conformance") == [b""]
    assert xm.rendezvous("conformance", b"payload") == [b"payload"]
    with pytest.raises(TypeError, match=r"^`payload` must be bytes, not <class 'str'>$"):
        xm.rendezvous("conformance", "not bytes")


def test_memory_info(xla_target):
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    dev = torch_xla.device()
    if xla_target.device_type == "CPU":
        # The PJRT CPU client has no allocator stats.
        with pytest.raises(RuntimeError, match=r"UNIMPLEMENTED: GetAllocatorStats is not "):
            xm.get_memory_info(dev)
    else:
        info = xm.get_memory_info(dev)
        assert set(info) == {"bytes_used", "bytes_limit", "peak_bytes_used"}
        assert all(type(v) is int for v in info.values())
        assert 0 < info["bytes_limit"] <= xla_target.spec.hbm_bytes_per_chip
        assert 0 <= info["bytes_used"] <= info["peak_bytes_used"] <= info["bytes_limit"]
        with pytest.warns(DeprecationWarning, match="Use torch_xla.device instead"):
            assert set(xm.get_memory_info()) == set(info)  # no device: calls xla_device()
    xr.use_spmd()
    with pytest.raises(RuntimeError):
        xm.get_memory_info(torch_xla.device())


def test_wait_device_ops_and_step_closures(xla_target):
    import torch_xla
    import torch_xla.core.xla_model as xm

    dev = torch_xla.device()
    t = torch.ones(2, device=dev) + 1
    seen = []
    xm.add_step_closure(lambda x, tag: seen.append((tag, x.cpu().tolist())), args=(t, "a"))
    xm.add_step_closure(lambda: seen.append(("b", None)))
    assert seen == []  # closures run at the step barrier, in order
    torch_xla.sync()
    assert seen == [("a", [2.0, 2.0]), ("b", None)]
    torch_xla.sync()
    assert len(seen) == 2  # each closure runs once
    assert xm.wait_device_ops() is None
    # devices are named as the runtime names them ('CPU:0', 'TPU:0'), not 'xla:0'
    assert xm.wait_device_ops(devices=torch_xla.real_devices()) is None
    assert xm.wait_device_ops(devices=[f"{xla_target.device_type}:0"]) is None


def test_optimizer_step(xla_target):
    import torch_xla
    import torch_xla.core.xla_model as xm

    dev = torch_xla.device()
    w = torch.tensor([1.0, -2.0, 3.0])
    model = torch.nn.Linear(3, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(w)
    model.to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    loss = model(torch.ones(1, 3, device=dev)).sum()
    loss.backward()
    # world size 1: gradients are not reduced; returns what optimizer.step() returns
    assert xm.optimizer_step(opt) is None
    assert xm.optimizer_step(opt, barrier=True, optimizer_args={}) is None
    # two SGD steps with the same gradient (ones): w - 2 * 0.5
    assert model.weight.detach().cpu().tolist() == [[0.0, -3.0, 2.0]]


def test_optimizer_step_with_closure_and_barrier(xla_target):
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met

    dev = torch_xla.device()
    model = torch.nn.Linear(3, 1).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def closure():
        opt.zero_grad()
        loss = model(torch.ones(2, 3, device=dev)).sum()
        loss.backward()
        return loss

    torch_xla.sync()
    steps = met.counter_value("MarkStep")
    # optimizer_args reach optimizer.step(); its result comes back
    loss = xm.optimizer_step(opt, optimizer_args={"closure": closure})
    assert isinstance(loss, torch.Tensor) and loss.device == dev
    assert met.counter_value("MarkStep") == steps  # no barrier: no sync
    xm.optimizer_step(opt, barrier=True, optimizer_args={"closure": closure})
    assert met.counter_value("MarkStep") == steps + 1
    with pytest.raises(
        TypeError, match=r"^SGD.step\(\) got an unexpected keyword argument 'bogus'$"
    ):
        xm.optimizer_step(opt, optimizer_args={"bogus": 1})


def test_save_loads_back_on_cpu(xla_target, tmp_path):
    import torch_xla
    import torch_xla.core.xla_model as xm

    dev = torch_xla.device()
    data = {
        "w": torch.arange(6.0, device=dev).reshape(2, 3),
        "nested": [torch.ones(2, dtype=torch.bfloat16, device=dev), 7, "text"],
    }
    path = tmp_path / "state.pt"
    xm.save(data, str(path))
    loaded = torch.load(path)
    assert loaded["w"].device == torch.device("cpu")
    assert loaded["w"].tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert loaded["nested"][0].device == torch.device("cpu")
    assert loaded["nested"][0].dtype == torch.bfloat16
    assert loaded["nested"][1:] == [7, "text"]
    assert data["w"].device == dev  # the caller's tensors stay on the device


def test_torch_save_of_device_tensors_loads_them_back_on_the_device(xla_target):
    """``torch.save`` of device tensors and a Parameter (each rebuilt from a CPU copy onto
    its device), loaded with the default ``weights_only=True``; read from real torch_xla 2.9
    on PJRT CPU, where a view's storage holds the view's own bytes."""
    import io

    import torch_xla

    dev = torch_xla.device()
    t = torch.arange(6.0, device=dev)
    param = torch.nn.Parameter(t.clone().reshape(2, 3))
    buffer = io.BytesIO()
    torch.save({"t": t, "view": t[1:], "param": param}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    for name, nbytes in (("t", 24), ("view", 20), ("param", 24)):
        value = loaded[name]
        assert isinstance(value, torch.Tensor)
        assert (value.device, value.type(), value.is_leaf) == (dev, "torch.xla.FloatTensor", True)
        assert value.untyped_storage().nbytes() == nbytes
    assert isinstance(loaded["param"], torch.nn.Parameter)
    assert loaded["param"].requires_grad and not loaded["t"].requires_grad
    assert loaded["param"].cpu().tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert loaded["view"].cpu().tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]


def test_send_cpu_data_to_device_rebuilds_data_wrappers(xla_target):
    # Measured on torch_xla 2.9 CPU: a DataWrapper's tensors are moved and the wrapper's
    # from_tensors builds what comes back, nested wrappers included.
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.utils.utils as xu

    class Pair(xu.DataWrapper):
        def __init__(self, first, second):
            self.first, self.second = first, second

        def get_tensors(self):
            return [self.first, self.second]

        def from_tensors(self, tensors):
            return Pair(*tensors)

    device = torch_xla.device()
    inner = Pair(torch.ones(2), torch.arange(3))
    [moved] = xm.send_cpu_data_to_device([Pair(inner, torch.zeros(1))], device)
    assert isinstance(moved, Pair) and isinstance(moved.first, Pair)
    assert moved.second.device == device and moved.first.first.device == device
    assert moved.first.second.cpu().tolist() == [0, 1, 2]
