"""The ``_XLAC`` primitives torch_xla's dynamo bridge is built on, buffer donation, and the
bridge's errors, as real torch_xla 2.9 gives them on PJRT CPU (each value below was read
there; upstream's dynamo/test_dynamo_integrations_util.py, test_graph_input_matcher.py and
test_dynamo_aliasing.py pass on it)."""

from __future__ import annotations

import pytest
import torch


def test_seed_and_materialization_queries(xla_target):
    import torch_xla
    import torch_xla.core.xla_model as xm

    dev = torch_xla.device()
    assert torch_xla._XLAC._get_seed_info_id() == -127389
    xm.set_rng_state(23, str(dev))
    seed = torch_xla._XLAC._get_base_seed_as_tensor(str(dev))
    assert (seed.item(), seed.dtype, seed.device.type) == (23, torch.int64, "xla")
    with pytest.raises(RuntimeError, match="Device string must not be empty"):
        torch_xla._XLAC._get_base_seed_as_tensor("")

    need = torch_xla._XLAC._check_tensor_need_materialization
    t = torch.ones(2, 3).to(dev)
    torch_xla.sync()
    assert need([torch.ones(2), t]) == [False, False]
    assert need([t * 2]) == [True]


def test_device_data_of_a_graph_and_cached_runs(xla_target):
    import torch_xla
    import torch_xla.debug.metrics as met
    from torch_xla._dynamo.dynamo_bridge import GraphInputMatcher

    xlac = torch_xla._XLAC
    dev = torch_xla.device()
    a = torch.tensor([1.0, 2.0]).to(dev)
    b = torch.tensor([10.0, 20.0]).to(dev)
    torch_xla.sync()
    total, product = a + b, a * b
    # Listed once each, an op's operands last to first: b, then a.
    ids, values = xlac._get_tensors_xla_device_data_node([total, product])
    assert ids == [xlac._xla_get_tensor_id(b), xlac._xla_get_tensor_id(a)]
    assert values[0] is not b
    assert xlac._get_tensors_handle(values) == xlac._get_tensors_handle([b, a])

    matcher = GraphInputMatcher({ids[1]: 0}, ids, values, {ids[1]})
    assert matcher.graph_input_xla_values.count(None) == 1  # a is an argument, not kept
    graph_hash = xlac._get_graph_hash([total, product])
    xlac._xla_warm_up_cache([total, product], [])
    out = xlac._run_cached_graph(graph_hash, matcher([a]))
    assert [o.cpu().tolist() for o in out] == [[11.0, 22.0], [10.0, 40.0]]
    assert "RunCachedGraphOutputData" in met.metric_names()
    with pytest.raises(RuntimeError, match="Failed to get computation by hash"):
        xlac._run_cached_graph(b"0123456789abcdef", [b, a])


def test_buffer_donation_marks(xla_target):
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met
    from torch_xla._dynamo.dynamo_bridge import alias_with_buffer_donor_config

    xlac = torch_xla._XLAC
    dev = torch_xla.device()
    data = torch.randn(4, 4).to(dev)
    met.clear_all()
    assert not xlac._set_buffer_donation(data + 1, True)  # a pending value has no buffer
    assert "XlaSetBufferDonation" not in met.counter_names()
    res = torch.cos(data)
    plain = xlac._get_graph_hash([res])
    assert xlac._set_buffer_donation(data, True)
    assert xlac._get_buffer_donation(data)
    assert met.counter_value("XlaSetBufferDonation") == 1
    assert xlac._get_graph_hash([res]) == plain
    with alias_with_buffer_donor_config():
        assert xlac._get_graph_hash([res]) != plain
    # (a sync of res would donate data's buffer: unmarked, it is only read)
    assert xlac._set_buffer_donation(data, False)

    def add_one(t):
        return t + 1

    given = torch.randn(4, 4).to(dev)
    assert xlac._set_buffer_donation(given, True)
    out = torch.compile(add_one, backend="openxla")(given)
    xm.wait_device_ops()
    assert "Data Handle: Deleted" in xlac._get_xla_tensor_debug_info(given)
    assert out.shape == (4, 4)

    def add_one_in_place(t):
        t += 1

    kept = torch.randn(4, 4).to(dev)
    before = kept.cpu()
    assert xlac._set_buffer_donation(kept, True)
    torch.compile(add_one_in_place, backend="openxla")(kept)
    assert not xlac._get_buffer_donation(kept)  # a new value, in a buffer of its own
    torch.testing.assert_close(kept.cpu(), before + 1)


def test_skip_input_data_check_refuses_pending_inputs(xla_target):
    import torch_xla
    from torch_xla._dynamo import config

    dev = torch_xla.device()
    compiled = torch.compile(lambda t: t * 2 + 1, backend="openxla")
    before = config.skip_input_data_check
    config.skip_input_data_check = True
    try:
        compiled(torch.randn(3, 4, device=dev))
        pending = torch.randn(3, 4, device=dev)
        pending += 5
        with pytest.raises(
            RuntimeError, match="input data to dynamo graph can not be a pending ir"
        ):
            compiled(pending)
    finally:
        config.skip_input_data_check = before


def test_ir_text_and_clearing_pending_ir(xla_target):
    # the text read on torch_xla 2.9 CPU for these graphs, byte for byte
    import torch_xla
    import torch_xla.debug.metrics as met

    xlac = torch_xla._XLAC
    dev = torch_xla.device()
    torch_xla.sync()
    t1 = torch.randn(20, 5).to(dev)
    t2 = torch.randn(20, 5).to(dev)
    t3 = t2 + t1
    t4 = t3 * t2
    data = "f32[20,5]{1,0} xla::device_data(), xla_shape=f32[20,5]{1,0}"
    assert xlac._get_xla_tensors_text([t4]) == (
        "IR {\n"
        f"  %0 = {data}\n"
        "  %1 = f32[] prim::Constant(), xla_shape=f32[]\n"
        f"  %2 = {data}\n"
        "  %3 = f32[20,5]{1,0} aten::add(%0, %2, %1), xla_shape=f32[20,5]{1,0}\n"
        "  %4 = f32[20,5]{1,0} aten::mul(%3, %0), xla_shape=f32[20,5]{1,0}, ROOT=0\n"
        "}\n"
    )
    met.clear_metrics()
    xlac._xla_sync_multi([t4], devices=[], wait=True)
    assert "aten::add(%2, %1, %0)" in xlac._get_xla_tensors_text([t3])
    xlac._clear_pending_irs(str(dev))
    assert xlac._get_xla_tensors_text([t3]) == f"IR {{\n  %0 = {data}, ROOT=0\n}}\n"
    torch_xla.sync()
    assert met.metric_data("ExecuteTime")[0] == 1  # the dropped IR never runs
