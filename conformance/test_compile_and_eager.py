"""``torch_xla.compile(full_graph=True)`` and eager mode, as real torch_xla 2.9 runs them.

A full-graph compiled function may trace but not execute: reading a value inside it raises
torch_xla's RuntimeError, after which execution is allowed again. Eager mode runs each op at
once as its own graph (an op seen before is a cached compile) and ``torch_xla.compile`` turns
it off inside the compiled function.
"""

from __future__ import annotations

import pytest
import torch

UNEXPECTED = "Unexpected execution happens inside the compiled function, exiting"


def test_full_graph_step_trains_like_cpu(xla_target):
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    reference = torch.nn.Linear(4, 3)
    reference.load_state_dict(model.state_dict())
    dev = torch_xla.device()
    model.to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    data, target = torch.randn(8, 4), torch.randint(0, 3, (8,))
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(x, y):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    compiled = torch_xla.compile(step, full_graph=True, name="train_step")
    met.clear_all()
    losses = [compiled(data.to(dev), target.to(dev)).item() for _ in range(3)]
    ref = []
    for _ in range(3):
        ref_opt.zero_grad()
        loss = loss_fn(reference(data), target)
        loss.backward()
        ref_opt.step()
        ref.append(loss.item())
    assert losses == pytest.approx(ref, rel=1e-5)
    # one graph per step; the step after the first has the same graph
    xm.wait_device_ops()  # torch_xla records an execution's time after its results are ready
    assert met.metric_data("ExecuteTime")[0] == 3
    assert met.counter_value("CachedCompile") >= 1
    assert torch_xla._XLAC._get_allow_execution() is True
    assert torch_xla._XLAC._get_current_graph_name() == ""


def test_full_graph_forbids_reading_values_inside(xla_target, capfd):
    import torch_xla

    seen = []

    def peeks(x):
        y = x * 2
        seen.append(torch_xla._XLAC._get_current_graph_name())
        seen.append(torch_xla._XLAC._get_allow_execution())
        y.sum().item()  # needs an execution
        return y

    x = torch.ones(3, device=torch_xla.device())
    with pytest.raises(RuntimeError, match=UNEXPECTED):
        torch_xla.compile(peeks, full_graph=True, name="peeks")(x)
    assert seen == ["peeks", False]
    assert "Unexpected Execution Analysis" in capfd.readouterr().err
    # execution is allowed again afterwards, and the same function runs without full_graph
    assert torch_xla._XLAC._get_allow_execution() is True
    assert torch_xla.compile(peeks)(x).cpu().tolist() == [2.0, 2.0, 2.0]
    with pytest.raises(RuntimeError, match=UNEXPECTED), torch_xla.compile(full_graph=True):
        (x + 1).cpu()


def test_allow_execution_switch(xla_target):
    import torch_xla

    x = torch.ones(2, device=torch_xla.device())
    y = x + 1
    torch_xla._XLAC._set_allow_execution(False)
    try:
        with pytest.raises(RuntimeError, match=UNEXPECTED):
            y.cpu()
        (x * 3).sum()  # tracing is still allowed
    finally:
        torch_xla._XLAC._set_allow_execution(True)
    # (torch_xla leaves the tensor whose execution failed unusable: only new work is checked)
    assert (x + 2).cpu().tolist() == [3.0, 3.0]


def test_eager_mode_runs_each_op(xla_target):
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met

    assert torch_xla.experimental.is_eager_mode() is False
    torch_xla.experimental.eager_mode(True)
    try:
        a = torch.ones(4, device=torch_xla.device())
        xm.wait_device_ops()
        met.clear_all()
        b = a + 1
        c = b * 2
        d = a + 1  # the same op on the same shapes: a cached compile
        xm.wait_device_ops()
        assert met.counter_value("ExecuteComputation") == 3
        assert met.counter_value("UncachedCompile") == 2
        assert met.counter_value("CachedCompile") == 1
        assert met.metric_data("ExecuteTime") is None
        assert met.metric_data("EagerOpExecuteTime")[0] == 3
        assert (c.cpu().tolist(), d.cpu().tolist()) == ([4.0] * 4, [2.0] * 4)

        def traced(x):
            assert torch_xla.experimental.is_eager_mode() is False
            return x * 5 - 1

        met.clear_all()
        out = torch_xla.compile(traced)(a)
        xm.wait_device_ops()
        assert torch_xla.experimental.is_eager_mode() is True
        assert met.metric_data("ExecuteTime")[0] == 1  # the compiled function: one graph
        assert out.cpu().tolist() == [4.0] * 4
    finally:
        torch_xla.experimental.eager_mode(False)


def test_eager_mode_context(xla_target):
    import torch_xla
    from torch_xla.experimental import eager_mode_context, is_eager_mode

    with eager_mode_context(True) as before:
        assert before is False and is_eager_mode() is True
        with eager_mode_context(False) as inner_before:
            assert inner_before is True and is_eager_mode() is False
        assert torch_xla._XLAC._get_use_eager_mode() is True
    assert is_eager_mode() is False


def test_eager_mode_transfers_and_clones(xla_target):
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met
    from torch_xla.experimental import eager_mode_context

    def eager_counts():
        xm.wait_device_ops()
        compiled, executed = (
            met.metric_data("EagerOpCompileTime"),
            met.metric_data("EagerOpExecuteTime"),
        )
        met.clear_all()
        return (compiled[0] if compiled else 0, executed[0] if executed else 0)

    with eager_mode_context(True):
        dev = torch_xla.device()
        met.clear_all()
        # A new device tensor's own IR runs before the transfer overwrites it: once compiled
        # per shape and dtype, executed every time.
        a = torch.randn(5).to(dev)
        assert eager_counts() == (1, 1)
        b = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], device=dev)
        assert eager_counts() == (0, 1)
        half = torch.ones(5).to(dev, dtype=torch.float16)
        assert eager_counts() == (1, 1)
        # A clone is the same IR value: nothing to run.
        c = a.clone()
        assert eager_counts() == (0, 0)
        c.add_(b)
        assert eager_counts() == (1, 1)
        assert torch.allclose(c.cpu(), a.cpu() + b.cpu())
        assert half.dtype == torch.float16


def test_clone_adds_no_node_to_the_graph(xla_target):
    import torch_xla

    dev = torch_xla.device()
    a = torch.randn(4, 3).to(dev)
    b = a * 2
    graph_hash = torch_xla._XLAC._get_graph_hash
    assert graph_hash([b.clone() + 1]) == graph_hash([b + 1])
    assert graph_hash([a.clone() * 2]) == graph_hash([b])
    c = b.clone()
    c.mul_(3)  # the clone gets a value of its own; b keeps its own
    torch_xla.sync()
    assert torch.allclose(c.cpu(), a.cpu() * 6) and torch.allclose(b.cpu(), a.cpu() * 2)
