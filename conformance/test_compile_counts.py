"""Lazy-graph compile accounting through torch_xla.debug.metrics.

Counts checked on real torch_xla 2.9 CPU, each in a fresh process: 6 identical train steps
compile once (UncachedCompile 1, CachedCompile 5); batch sizes 2,2,4,2,8,4 compile one graph
per distinct shape (UncachedCompile 3, CachedCompile 3).
"""

from __future__ import annotations

import time

import torch


def _train_step_fn(dev):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    model.to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(0)

    def step(batch_size: int) -> None:
        import torch_xla

        x = torch.randn(batch_size, 8, generator=g).to(dev)
        y = torch.randn(batch_size, 1, generator=g).to(dev)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        torch_xla.sync()

    return step


def test_identical_steps_compile_once(xla_target):
    import torch_xla
    import torch_xla.debug.metrics as met

    step = _train_step_fn(torch_xla.device())
    met.clear_all()
    assert met.counter_value("UncachedCompile") is None
    for _ in range(6):
        step(4)
    assert met.counter_value("UncachedCompile") == 1
    assert met.counter_value("CachedCompile") == 5
    assert met.counter_value("MarkStep") == 6
    assert met.metric_data("CompileTime")[0] == 1


def test_batch_size_changes_recompile(xla_target):
    import torch_xla
    import torch_xla.debug.metrics as met

    step = _train_step_fn(torch_xla.device())
    met.clear_all()
    for batch_size in (2, 2, 4, 2, 8, 4):
        step(batch_size)
    assert met.counter_value("UncachedCompile") == 3
    assert met.counter_value("CachedCompile") == 3


def test_metrics_api(xla_target):
    import torch_xla
    import torch_xla.debug.metrics as met

    dev = torch_xla.device()
    met.clear_all()
    started = time.time()
    assert met.counter_names() == []
    assert met.metric_names() == []
    assert met.counter_value("UncachedCompile") is None
    assert met.counter_value("NoSuchCounter") is None
    assert met.metric_data("NoSuchMetric") is None
    t = torch.ones(4, device=dev) * 3
    torch_xla.sync()
    assert t.cpu().tolist() == [3.0] * 4
    for name in ("UncachedCompile", "MarkStep"):
        assert name in met.counter_names()
        assert type(met.counter_value(name)) is int
    assert {"CompileTime", "ExecuteTime"} <= set(met.metric_names())
    samples, accumulator, values = met.metric_data("CompileTime")
    assert type(samples) is int and samples == 1
    assert isinstance(accumulator, float) and accumulator > 0
    assert isinstance(values, tuple) and len(values) == samples
    timestamp, value = values[0]
    assert isinstance(timestamp, float) and isinstance(value, float) and value > 0
    # A sample's time is wall-clock seconds since the epoch (real torch_xla 2.9 on CPU), while
    # its value is in nanoseconds.
    assert started - 1 <= timestamp <= time.time() + 1
    report = met.metrics_report()
    assert isinstance(report, str)
    for line in (
        "Metric: CompileTime",
        "Metric: ExecuteTime",
        "Counter: UncachedCompile",
        "Counter: MarkStep",
    ):
        assert line in report
    short = met.short_metrics_report()
    assert "Metric: CompileTime" in short and "Metric: ExecuteTime" in short
    met.clear_counters()
    assert met.counter_names() == [] and met.counter_value("UncachedCompile") is None
    assert "CompileTime" in met.metric_names()
    met.clear_metrics()
    assert met.metric_names() == []


def test_short_metrics_report_picks_names(xla_target):
    import torch_xla
    import torch_xla.debug.metrics as met

    dev = torch_xla.device()
    for _ in range(2):  # the second, identical graph is a cached compile
        doubled = torch.ones(3, device=dev) * 2  # kept alive: only live tensors are computed
        torch_xla.sync()
    assert doubled.cpu().tolist() == [2.0] * 3

    def headers(report):
        return {line for line in report.splitlines() if not line.startswith("  ")}

    # names that were never recorded are left out; unasked ones are too
    picked = met.short_metrics_report(["MarkStep", "Nope"], ["CompileTime", "Nope"])
    assert headers(picked) == {"Metric: CompileTime", "Counter: MarkStep"}
    assert "  TotalSamples: 1\n" in picked and "  Value: 2\n" in picked
    # no names (None or empty) means CachedCompile, MarkStep and the compile/execute/transfer
    # timings
    default = met.short_metrics_report()
    assert {"Counter: CachedCompile", "Counter: MarkStep", "Metric: CompileTime"} <= headers(
        default
    )
    assert "Metric: ExecuteTime" in headers(default)
    assert "Counter: UncachedCompile" not in headers(default)
    assert headers(met.short_metrics_report([], [])) == headers(default)
