"""The simulator's side of ``torch.compile(backend="openxla")``: dynamo is taught about the
simulated tensors only once it is imported, and what the bridge does not simulate raises
NotImplementedError naming it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

import xlasim

_LAZY = textwrap.dedent(
    """
    import sys
    import torch
    import xlasim

    with xlasim.simulate("2x2"):
        import torch_xla

        assert "torch._dynamo" not in sys.modules  # importing torch_xla stays cheap
        x = torch.ones(3).to(torch_xla.device())
        y = torch.compile(lambda a: a * 2, backend="openxla")(x)
        import torch._dynamo

        # torch_xla 2.9's settings, applied when dynamo was imported
        assert torch._dynamo.config.automatic_dynamic_shapes is False
        assert torch._dynamo.config.specialize_float is True
        assert torch.equal(y.cpu(), torch.full((3,), 2.0))
    print("ok")
    """
)


def test_dynamo_is_taught_when_it_is_imported():
    done = subprocess.run(
        [sys.executable, "-c", _LAZY], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok")


def test_dynamic_shapes_are_not_simulated():
    with xlasim.simulate("2x2"):
        import torch_xla

        x = torch.ones(4, 3).to(torch_xla.device())
        compiled = torch.compile(lambda a: a * 2, backend="openxla", dynamic=True)
        with pytest.raises(NotImplementedError, match="dynamic shapes"):
            compiled(x)


def test_graphs_updating_tensors_in_place_are_not_simulated():
    with xlasim.simulate("2x2"):
        import torch_xla
        from torch_xla.core.dynamo_bridge import extract_compiled_graph

        graph = torch.fx.Graph()
        a = graph.placeholder("a")
        graph.output((graph.call_function(torch.ops.aten.add_.Tensor, (a, a)),))
        x = torch.ones(3).to(torch_xla.device())
        with pytest.raises(NotImplementedError, match="in place"):
            extract_compiled_graph(torch.fx.GraphModule({}, graph), [x])
        assert torch.equal(x.cpu(), torch.ones(3))  # nothing ran


def test_a_graph_is_split_around_its_cpu_nodes():
    # torch_xla 2.9's bridge compiles the device parts of the graph as programs of their own
    # and runs the nodes on CPU tensors between them (upstream dynamo/test_bridge.py's
    # *_flag_unsupported tests pass on real torch_xla 2.9 on CPU)
    with xlasim.simulate("2x2"):
        import torch_xla
        import torch_xla.debug.metrics as met
        from torch_xla.core.dynamo_bridge import extract_compiled_graph

        graph = torch.fx.Graph()
        a = graph.placeholder("a")
        doubled = graph.call_function(torch.ops.aten.mul.Tensor, (a, a))
        on_cpu = graph.call_function(torch.ops.aten._to_copy.default, (doubled,), {"device": "cpu"})
        graph.output((graph.call_function(torch.ops.aten.add.Tensor, (on_cpu, on_cpu)),))
        x = torch.full((3,), 3.0).to(torch_xla.device())
        compiled = extract_compiled_graph(torch.fx.GraphModule({}, graph), [x])
        met.clear_all()
        (out,) = compiled(torch.full((3,), 2.0).to(torch_xla.device()))
        assert out.device.type == "cpu"
        assert out.tolist() == [8.0, 8.0, 8.0]
        assert met.metric_data("ExecuteTime")[0] == 1  # the device part, one program
