"""Ops torch_xla 2.9 does not lower run on its CPU fallback, and that shows.

The op's xla inputs are computed first (a graph of their own: the step's graph splits there),
the op runs on the host, its result waits on the host until its first use, and the call is
counted as ``aten::<op>`` (with the overload torch_xla's dispatcher saw: ``polar`` runs its
composite kernel, which calls ``polar.out``). Expectations read from real torch_xla 2.9 on
PJRT CPU.
"""

from __future__ import annotations

import re

import pytest
import torch


def _fallback_counters():
    import torch_xla.debug.metrics as met

    return {n: met.counter_value(n) for n in met.counter_names() if n.startswith("aten::")}


@pytest.mark.parametrize(
    ("name", "run", "counter"),
    [
        ("polar", lambda a, b: torch.polar(a, b), "aten::polar.out"),
        ("histc", lambda a, b: torch.histc(a, bins=4), "aten::histc"),
        (
            "searchsorted",
            lambda a, b: torch.searchsorted(b[0].sort().values, a),
            "aten::searchsorted.Tensor",
        ),
        ("median", lambda a, b: a.median(), "aten::median"),
        # lowered only under XLA_EXPERIMENTAL (a dynamic output shape): a fallback by default
        ("nonzero", lambda a, b: (a > 0.5).nonzero(), "aten::nonzero"),
        ("masked_select", lambda a, b: a.masked_select(b > 0.5), "aten::masked_select"),
        ("lowered", lambda a, b: (a * b).kthvalue(2, dim=1).values, None),
    ],
)
def test_fallback_counters_and_values(xla_target, name, run, counter):
    import torch_xla
    import torch_xla.debug.metrics as met

    torch.manual_seed(0)
    a, b = torch.rand(8, 4), torch.rand(8, 4)
    expected = run(a, b)
    xa, xb = a.to("xla"), b.to("xla")
    torch_xla.sync()
    met.clear_all()
    got = run(xa, xb)
    assert _fallback_counters() == ({counter: 1} if counter else {})
    assert torch.allclose(got.cpu(), expected)


def test_a_fallback_splits_the_graph_and_leaves_its_result_on_the_host(xla_target):
    import torch_xla
    import torch_xla.debug.metrics as met

    dev = torch_xla.device()
    a, b = torch.rand(8, 4).to(dev), torch.rand(8, 4).to(dev)
    torch_xla.sync()
    met.clear_all()
    p = torch.polar(a + b, b)  # a + b has to be computed for the host: one graph runs now
    assert met.metric_data("CompileTime")[0] == 1
    assert met.metric_data("TransferFromDeviceTime")[0] == 1
    assert met.metric_data("TransferToDeviceTime") is None
    info = torch_xla._XLAC._get_xla_tensor_debug_info(p)
    assert "IR: None\nXLAData: None\nTensor on host: with size [8, 4]" in info
    q = p + p  # its first use uploads it
    assert met.metric_data("TransferToDeviceTime")[0] == 1
    torch_xla.sync()
    assert "Tensor on host: None" in torch_xla._XLAC._get_xla_tensor_debug_info(p)
    expected = torch.polar(a.cpu() + b.cpu(), b.cpu()) * 2
    assert torch.allclose(q.cpu(), expected)


def test_under_spmd_the_barrier_replicates_a_fallback_result(xla_target):
    import torch_xla
    import torch_xla.runtime as xr

    xr.use_spmd()
    dev = torch_xla.device()
    freqs = torch.outer(torch.arange(16, device=dev).float(), torch.rand(4).to(dev))
    cis = torch.polar(torch.ones_like(freqs), freqs)
    info = torch_xla._XLAC._get_xla_tensor_debug_info(cis)
    assert "ShardingSpec: None" in info and "Tensor on host: with size [16, 4]" in info
    torch_xla.sync()
    info = torch_xla._XLAC._get_xla_tensor_debug_info(cis)
    assert "Data Shape: c64[16,4]\n  OpSharding: {replicated}" in info
    # ...while the tensor itself still reports no sharding of its own.
    assert torch_xla._XLAC._get_xla_sharding_spec(cis) == ""


def test_boolean_mask_indices_go_through_nonzero(xla_target):
    """A mask among the indices (``x[mask]``, ``x[mask] = v``) becomes the integer indices of
    its true elements through ``nonzero``, which runs on the CPU fallback: the mask's graph
    runs first, then the indexing's own."""
    import torch_xla
    import torch_xla.debug.metrics as met

    def samples(name):
        data = met.metric_data(name)
        return data[0] if data else 0

    x = torch.arange(12.0).view(3, 4).to("xla")
    torch_xla.sync()
    met.clear_all()
    assert x[x > 4].cpu().tolist() == [5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0]
    assert (samples("CompileTime"), samples("ExecuteTime")) == (2, 2)
    assert _fallback_counters() == {"aten::nonzero": 1}
    met.clear_all()
    rows = torch.tensor([True, False, True]).to("xla")
    assert x[rows, 1:].cpu().tolist() == [[1.0, 2.0, 3.0], [9.0, 10.0, 11.0]]
    assert x[1, torch.tensor([True, False, True, True]).to("xla")].cpu().tolist() == [4, 6, 7]
    assert _fallback_counters() == {"aten::nonzero": 2}
    x[x > 9] += 100
    assert x.cpu()[2].tolist() == [8.0, 9.0, 110.0, 111.0]
    message = (
        "Check failed: index->size(j) == self.size(src_idx) (2 vs. 3)The shape of the mask [2] "
        "at index 0 does not match the shape of the indexed tensor [3, 4] at index 0"
    )
    with pytest.raises(RuntimeError, match=re.escape(message)):
        x[torch.tensor([True, False]).to("xla")]
