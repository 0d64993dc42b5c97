"""``xm.CoalescingBuckets`` and the bucketized collectives in one process, as real torch_xla 2.9
behaves on CPU (one replica). How the buckets split is a fact of torch_xla's Python; the values
over several replicas are in tests/test_process_group_sim.py."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.topology("1x1", accelerator="v6e")

KIB = 1024 // 4  # float32 elements in a KiB


def test_coalescing_buckets_split(xla_target):
    import torch_xla.core.xla_model as xm

    calls = []

    def record(values, outputs):
        calls.append((values if torch.is_tensor(values) else list(values), outputs))
        return values

    # With a 1 MiB cap: a big tensor joins a bucket under half the cap when both fit in two
    # caps, and closes it; otherwise a bucket closes before the tensor that overfills it.
    sizes = {"a": 256, "c": 1536, "d": 768, "e": 512, "f": 3072}
    tensors = {k: torch.zeros(n * KIB) for k, n in sizes.items()}
    inputs = list(tensors.values())
    results = xm.CoalescingBuckets(record, inputs, bucket_cap_mb=1)()
    assert results == inputs
    assert [(v if isinstance(v, list) else [v], o) for v, o in calls] == [
        ([tensors["a"], tensors["c"]], None),
        ([tensors["d"]], None),
        ([tensors["e"]], None),
        ([tensors["f"]], None),
    ]
    assert not isinstance(calls[1][0], list)  # a bucket of one: the tensor itself

    calls.clear()
    outs = [torch.ones(1) for _ in inputs]
    xm.CoalescingBuckets(record, inputs, outs, bucket_cap_mb=0)()
    assert [o for _, o in calls] == outs  # cap 0: one bucket per tensor, with its output


def test_coalescing_buckets_errors(xla_target):
    import torch_xla.core.xla_model as xm

    def func(values, outputs):
        return values

    with pytest.raises(TypeError, match=r"^`input_list` needs to be a list of Tensors, but"):
        xm.CoalescingBuckets(func, torch.zeros(2))
    with pytest.raises(TypeError, match=r"^`output_list` needs to be a list of Tensors, but"):
        xm.CoalescingBuckets(func, [torch.zeros(2)], [1])
    with pytest.raises(ValueError) as raised:
        xm.CoalescingBuckets(func, [torch.zeros(2)], [torch.zeros(2)] * 2)
    assert str(raised.value) == "`output_list` length doesn't match `input_list` length: 2 vs 1."


def test_all_gather_bucketized_one_replica(xla_target):
    import torch_xla
    import torch_xla.core.xla_model as xm

    dev = torch_xla.device()
    values = [torch.arange(4.0, device=dev), torch.ones(2, 3, device=dev)]
    gathered = xm.all_gather_bucketized(values)
    assert [g.cpu().tolist() for g in gathered] == [v.cpu().tolist() for v in values]
    with pytest.raises(RuntimeError) as raised:
        xm.all_gather_bucketized(values, pin_layout=True)
    assert str(raised.value) == (
        "For xm.all_gather_bucketized, pin_layout=True is not yet supported."
    )


def test_collective_permute_one_replica(xla_target):
    import torch_xla
    import torch_xla.core.xla_model as xm

    value = torch.arange(3.0, device=torch_xla.device())
    assert xm.collective_permute(value, [[0, 0]]).cpu().tolist() == [0.0, 1.0, 2.0]


def test_an_output_takes_the_result_whatever_its_shape(xla_target):
    import torch_xla
    import torch_xla.core.xla_model as xm

    # torch_xla's out-variants replace the output's data: its values are the result's.
    dev = torch_xla.device()
    output = torch.zeros(5, device=dev)
    assert xm.all_gather(torch.ones(2, device=dev), output=output) is output
    assert output.cpu().tolist() == [1.0, 1.0]
    outputs = [torch.zeros(5, device=dev)]
    assert xm.all_gather([torch.ones(2, device=dev)], output=outputs, pin_layout=False) is outputs
    assert outputs[0].cpu().tolist() == [1.0, 1.0]
