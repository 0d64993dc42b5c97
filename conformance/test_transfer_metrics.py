"""Transfer and compile metrics through torch_xla.debug.metrics.

Read from real torch_xla 2.9 on PJRT CPU (4 devices): each host-to-device transfer call
records one ``TensorToData`` and one ``TransferToDeviceTime`` sample and one ``OutboundData``
sample of the bytes its device buffers take (a list sent at once is one call); under SPMD a
``.to('xla')`` sends nothing yet, and ``mark_sharding`` then sends each device its shard. A
device-to-host copy records ``InboundData`` (the tensor's bytes). Each compiled graph counts
one ``CreateCompileHandles``; a short report always lists the ``aten::`` CPU fallbacks.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch


def _samples(met, name):
    data = met.metric_data(name)
    return None if data is None else data[:2]


def test_transfers_count_calls_and_bytes(xla_target):
    import torch_xla
    import torch_xla.debug.metrics as met

    dev = torch_xla.device()
    met.clear_all()
    torch.tensor(100, device=dev)  # int64: 8 bytes
    assert _samples(met, "OutboundData") == (1, 8.0)
    assert met.metric_data("TensorToData")[0] == met.metric_data("TransferToDeviceTime")[0] == 1
    a = torch.ones(4, 4).to(dev)
    torch.ones(2, 3, dtype=torch.float64).to(dev)
    assert _samples(met, "OutboundData") == (3, 8.0 + 64 + 48)
    met.clear_all()
    torch_xla._XLAC._xla_tensors_from_aten([torch.ones(4, 4), torch.ones(8)], [str(dev)] * 2)
    assert _samples(met, "OutboundData") == (1, 96.0)
    assert met.metric_data("TensorToData")[0] == 1
    assert _samples(met, "InboundData") is None
    a.cpu()
    assert _samples(met, "InboundData") == (1, 64.0)
    assert met.metric_data("TransferFromDeviceTime")[0] == 1


def test_compile_handles_and_short_report(xla_target):
    import torch_xla
    import torch_xla.debug.metrics as met

    t = torch.tensor(100.0, device=torch_xla.device())
    met.clear_all()
    u = t * 2
    torch_xla.sync()
    assert met.counter_value("CreateCompileHandles") == 1
    u = t * 2
    torch_xla.sync()
    assert met.counter_value("CreateCompileHandles") == 1  # cached: nothing compiled
    assert met.counter_value("aten::_local_scalar_dense") is None
    # Reading a pending value back compiles its graph and is a CPU fallback.
    assert bool(u * 3 + 1)
    assert met.counter_value("CreateCompileHandles") == 2
    assert met.counter_value("aten::_local_scalar_dense") == 1
    short = met.short_metrics_report(counter_names=["MarkStep"], metric_names=["InboundData"])
    names = [line for line in short.splitlines() if line.startswith(("Counter", "Metric"))]
    assert names == [
        "Metric: InboundData",
        "Counter: MarkStep",
        "Counter: aten::_local_scalar_dense",
    ]
    assert "Counter: aten::_local_scalar_dense" in met.short_metrics_report()


def test_increment_counter(xla_target):
    import torch_xla
    import torch_xla.debug.metrics as met

    met.clear_all()
    torch_xla._XLAC._xla_increment_counter("MarkStep", 3)
    torch_xla._XLAC._xla_increment_counter("NoSuchCounterYet", 2)
    assert (met.counter_value("MarkStep"), met.counter_value("NoSuchCounterYet")) == (3, 2)
    for args in (("MarkStep", -1), (1, 1)):
        with pytest.raises(TypeError, match="incompatible function arguments"):
            torch_xla._XLAC._xla_increment_counter(*args)
    with pytest.raises(TypeError):
        torch_xla._XLAC._xla_increment_counter("MarkStep")
    assert met.counter_value("MarkStep") == 3


def test_spmd_transfers_send_shards(xla_target):
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    if xla_target.num_devices != 4:
        pytest.skip(f"written for a 4-device slice, {xla_target} has {xla_target.num_devices}")
    xr.use_spmd()
    mesh = xs.Mesh(np.arange(4), (1, 4))
    met.clear_all()
    x = torch.ones(4, 4).to("xla")
    assert _samples(met, "OutboundData") is None  # kept on the host until sharded or used
    xs.mark_sharding(x, mesh, (0, 1))
    assert _samples(met, "OutboundData") == (1, 64.0)  # four 4x1 shards
    met.clear_all()
    spec = xs.ShardingSpec(mesh, (0, 1))
    xm.send_cpu_data_to_device([torch.ones(4, 4)], torch_xla.device(), spec)
    assert _samples(met, "OutboundData") == (1, 64.0)
    met.clear_all()
    xm.send_cpu_data_to_device([torch.ones(4, 4)], torch_xla.device())
    assert _samples(met, "OutboundData") == (1, 256.0)  # replicated: a copy per device
    met.clear_all()
    x.cpu()
    assert _samples(met, "InboundData") == (1, 64.0)


def test_spmd_reads_count_replicate_sharded_data(xla_target):
    """Under SPMD every read of device data back to the host gathers it
    (``ReplicateShardedData``), replicated data too; data still on the host is not counted."""
    import torch_xla
    import torch_xla.debug.metrics as met
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    if xla_target.num_devices != 4:
        pytest.skip(f"written for a 4-device slice, {xla_target} has {xla_target.num_devices}")
    xr.use_spmd()
    sharded = torch.ones(4, 4).to("xla")
    xs.mark_sharding(sharded, xs.Mesh(np.arange(4), (1, 4)), (0, 1))
    replicated = torch.ones(4, 4).to("xla") + 0
    on_host = torch.ones(4, 4).to("xla")
    torch_xla.sync()
    met.clear_all()
    on_host.cpu()
    assert met.counter_value("ReplicateShardedData") is None
    sharded.cpu()
    replicated.cpu()
    assert met.counter_value("ReplicateShardedData") == 2
    assert (sharded + 1).sum().item() == 32.0
    assert met.counter_value("ReplicateShardedData") == 3


def test_input_output_alias_count_per_compiled_graph(xla_target):
    import torch_xla
    import torch_xla.debug.metrics as met

    dev = torch_xla.device()

    def donors_after(update):
        # One new graph per case (shapes no other test uses): one sample per compile.
        torch_xla.sync()
        met.clear_all()
        update()
        torch_xla.sync()
        return _samples(met, "InputOutputAliasCount")

    a = torch.randn(3, 13).to(dev)
    b = torch.randn(13).to(dev)
    c = torch.tensor(2.5, device=dev)
    # in place at the step barrier: the old buffers go to the outputs
    assert donors_after(lambda: (a.add_(1), b.mul_(2))) == (1, 2.0)
    # a rank-0 tensor does not donate its buffer
    assert donors_after(lambda: c.add_(1)) == (1, 0.0)
    # an out-of-place result donates nothing (and the sample is still taken)
    kept = []
    assert donors_after(lambda: kept.append(torch.randn(17).to(dev) * 2)) == (1, 0.0)
    # the same graph again is not compiled again: no sample
    assert donors_after(lambda: (a.add_(1), b.mul_(2))) is None
    # a sync for a value (not a step barrier) keeps the old buffers
    met.clear_all()
    d = torch.randn(19).to(dev)
    d.add_(1)
    d.cpu()
    assert _samples(met, "InputOutputAliasCount") == (1, 0.0)


def test_report_writes_bytes_and_durations_with_units(xla_target):
    import torch_xla
    import torch_xla.debug.metrics as met

    met.clear_all()
    t = torch.ones(300).to(torch_xla.device())  # 1200 bytes each way
    t.cpu()
    report = met.metrics_report()

    def accumulator(name: str) -> str:
        block = report.split(f"Metric: {name}\n", 1)[1]
        return block.split("Accumulator: ", 1)[1].split("\n", 1)[0]

    assert accumulator("OutboundData") == "1.17KB"
    assert accumulator("InboundData") == "1.17KB"
    assert re.fullmatch(r"(\d+s)?(\d+ms)?\d+\.\d{3}us", accumulator("TransferToDeviceTime"))


def test_spmd_execution_time_is_a_duration(xla_target):
    import torch_xla
    import torch_xla.debug.metrics as met
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    xr.use_spmd()
    n = xr.global_runtime_device_count()
    mesh = xs.Mesh(np.arange(n), (n, 1))
    t = torch.ones(4 * n, 4).to(torch_xla.device())
    xs.mark_sharding(t, mesh, (0, None))
    met.clear_all()
    assert (t * 2).sum().item() == 32 * n
    report = met.metrics_report()
    block = report.split("Metric: ExecuteReplicatedTime\n", 1)[1]
    value = block.split("Accumulator: ", 1)[1].split("\n", 1)[0]
    assert re.fullmatch(r"(\d+s)?(\d+ms)?\d+\.\d{3}us", value), value


def _numbers_moved(met):
    """(cache misses, transfers, data handles) so far."""
    transfers = met.metric_data("TransferToDeviceTime")
    return (
        met.counter_value("DeviceDataCacheMiss") or 0,
        transfers[0] if transfers else 0,
        met.counter_value("CreateDataHandles") or 0,
    )


@pytest.mark.parametrize("spmd", [False, True], ids=["plain", "spmd"])
def test_python_numbers_are_moved_once_each(xla_target, spmd):
    """A number an op takes is device data, moved when first used (per value, in the dtype
    it is moved as), except 0, 1 and -1, which the graph holds; under SPMD it lands on every
    device. Read from real torch_xla 2.9 on PJRT CPU (4 devices)."""
    import torch_xla
    import torch_xla.debug.metrics as met
    import torch_xla.runtime as xr

    if spmd:
        if xla_target.num_devices != 4:
            pytest.skip(f"written for a 4-device slice, {xla_target} has {xla_target.num_devices}")
        xr.use_spmd()
    handles = 4 if spmd else 1
    dev = torch_xla.device()
    t = torch.ones(4, 4).to(dev)
    (t * t).cpu()  # the tensor itself moved before counting
    met.clear_all()
    t * 2.25
    assert _numbers_moved(met) == (1, 1, handles)
    assert _samples(met, "OutboundData") == (1, 4.0 * handles)  # one float32 per device
    t + 2.25  # the same value: its data is reused
    t * 1
    t * 0.0
    t * -1
    assert _numbers_moved(met) == (1, 1, handles)
    torch_xla.sync()
    t.add(t, alpha=3)  # an int, moved as the float32 the op computes in
    t.add(t, alpha=3.0)
    assert _numbers_moved(met) == (2, 2, 2 * handles)
    t.clamp(min=0.75)  # and the float32 extreme as the missing bound
    assert _numbers_moved(met) == (4, 4, 4 * handles)
    t.pow(3.5)  # pow's exponent is written into the graph
    assert _numbers_moved(met) == (4, 4, 4 * handles)
