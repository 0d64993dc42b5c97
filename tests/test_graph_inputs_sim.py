"""A pending graph's device data as torch_xla's IR lists it, and a warmed-up graph run again
on new data (``_run_cached_graph``), as torch_xla's dynamo bridge uses them.

Expected values were measured with real torch_xla 2.9 on CPU (``PJRT_DEVICE=CPU``); tensor
ids are compared among themselves only, as torch_xla numbers every tensor it creates.
"""

from __future__ import annotations

import pytest
import torch

import xlasim


def _setup() -> tuple[object, list[torch.Tensor]]:
    import torch_xla

    dev = torch_xla.device()
    values = ([0.5, 0.75], [0.25, 0.125], [0.3125, 0.625])
    inputs = [torch.tensor(v).to(dev) for v in values]
    torch_xla.sync()
    return torch_xla._XLAC, inputs


def test_data_written_over_in_place_is_listed_with_its_old_values_and_id():
    # torch_xla 2.9 on CPU: after b.add_(a), b's graph reads a, then b's data from before the
    # write, listed with the id b had then; b itself has a new id.
    with xlasim.simulate("2x2"):
        xlac, (a, b, _) = _setup()
        id_a, id_b = xlac._xla_get_tensor_id(a), xlac._xla_get_tensor_id(b)
        b.add_(a)
        assert xlac._xla_get_tensor_id(b) not in (id_a, id_b)
        ids, values = xlac._get_tensors_xla_device_data_node([b])
        assert ids == [id_a, id_b]
        assert torch.equal(values[0].cpu(), torch.tensor([0.5, 0.75]))
        assert torch.equal(values[1].cpu(), torch.tensor([0.25, 0.125]))
        assert torch.equal(b.cpu(), torch.tensor([0.75, 0.875]))


def test_zero_and_fill_read_no_device_data():
    # torch_xla 2.9 on CPU: ``b.zero_()`` and ``c.fill_(0)`` become a constant expanded to the
    # shape; their graphs list no device data.
    with xlasim.simulate("2x2"):
        xlac, (_, b, c) = _setup()
        xlac._xla_get_tensor_id(b)
        b.zero_()
        c.fill_(0)
        assert xlac._get_tensors_xla_device_data_node([b]) == ([], [])
        assert xlac._get_tensors_xla_device_data_node([c]) == ([], [])


def test_data_of_a_freed_tensor_is_listed():
    # torch_xla 2.9 on CPU: a graph still lists data whose tensor was deleted, with its id.
    with xlasim.simulate("2x2"):
        import torch_xla

        xlac, (a, _, _) = _setup()
        e = torch.tensor([2.0, 4.0]).to(torch_xla.device())
        f = e * a
        id_a, id_e = xlac._xla_get_tensor_id(a), xlac._xla_get_tensor_id(e)
        del e
        ids, values = xlac._get_tensors_xla_device_data_node([f])
        assert ids == [id_a, id_e]
        assert torch.equal(values[1].cpu(), torch.tensor([2.0, 4.0]))


def test_run_cached_graph_computes_the_graph_on_new_data():
    # torch_xla 2.9 on CPU, for (a + b, a + c, b) after b.zero_(): the graph reads a and c,
    # returns its three pending values (b's too, as the write made it pending), and run on
    # a=[1, 2], c=[5, 6] gives [1, 2], [6, 8], [0, 0]; running compiles nothing and records
    # ExecuteTime and the RunCachedGraph* metrics.
    with xlasim.simulate("2x2"):
        import torch_xla
        import torch_xla.debug.metrics as met

        xlac, (a, b, c) = _setup()
        id_a, id_c = xlac._xla_get_tensor_id(a), xlac._xla_get_tensor_id(c)
        b.zero_()
        outputs = (a + b, a + c, b)
        graph_hash = xlac._get_graph_hash(outputs)
        ids, _ = xlac._get_tensors_xla_device_data_node(outputs)
        assert ids == [id_a, id_c]
        xlac._xla_warm_up_cache(outputs, [])
        dev = torch_xla.device()
        new_a, new_c = torch.tensor([1.0, 2.0]).to(dev), torch.tensor([5.0, 6.0]).to(dev)
        met.clear_all()
        results = xlac._run_cached_graph(graph_hash, [new_a, new_c])
        assert [r.cpu().tolist() for r in results] == [[1.0, 2.0], [6.0, 8.0], [0.0, 0.0]]
        names = met.metric_names()
        for name in ("ExecuteTime", "RunCachedGraphInputData", "RunCachedGraphOutputData"):
            assert name in names
        assert "CompileTime" not in names
        assert met.counter_value("CachedCompile") is None
        # The outputs are data of their own: the inputs are left as they were.
        assert new_a.cpu().tolist() == [1.0, 2.0]


def test_run_cached_graph_refuses_inputs_unlike_the_traced_ones():
    # The simulator's own checks (torch_xla 2.9 does not check the inputs against the
    # program): a wrong shape or count is an error rather than a wrong answer.
    with xlasim.simulate("2x2"):
        import torch_xla

        xlac, (a, b, _) = _setup()
        out = a * b
        graph_hash = xlac._get_graph_hash([out])
        xlac._xla_warm_up_cache([out], [])
        wrong = torch.ones(3).to(torch_xla.device())
        with pytest.raises(RuntimeError, match="compiled for"):
            xlac._run_cached_graph(graph_hash, [a, wrong])
        with pytest.raises(RuntimeError, match="2 device data inputs, 1 given"):
            xlac._run_cached_graph(graph_hash, [a])
