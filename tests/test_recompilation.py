"""The recompilation report: which input changed and which line of the user's code cut the graph."""

from __future__ import annotations

import inspect

import pytest
import torch

import xlasim
from xlasim.reports.recompilation import (
    RecompilationError,
    assert_no_recompilation,
    clear_recompilations,
    recompilation_report,
    recompilations,
)


def _line_of(marker: str, func) -> int:
    """The line number of the source line of ``func`` containing ``marker``."""
    lines, start = inspect.getsourcelines(func)
    for offset, text in enumerate(lines):
        if marker in text:
            return start + offset
    raise AssertionError(f"{marker!r} not in {func.__name__}")


def _train(batch_sizes, dtype=torch.float32):
    import torch_xla

    device = torch_xla.device()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for bs in batch_sizes:
        x = torch.randn(bs, 8).to(dtype).to(device)
        loss = model(x.float()).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        torch_xla.sync()  # CUT-HERE


def test_shape_change_is_reported_with_the_changed_input_and_the_site():
    with xlasim.simulate("2x2"):
        _train([4, 4, 4, 3])
        reports = recompilations()
        assert len(reports) == 1
        (r,) = reports
        assert r.filename == __file__
        assert r.lineno == _line_of("CUT-HERE", _train)
        assert r.function == "_train"
        changed = [c for c in r.changed_inputs if c.fields == ("shape",)]
        assert changed, r.describe()
        assert {(tuple(c.before.shape), tuple(c.after.shape)) for c in changed} == {
            ((4, 8), (3, 8))
        }
        text = recompilation_report()
        assert "1 recompilation(s) at 1 site(s)" in text
        assert f"{__file__}:{r.lineno}" in text
        assert "shape [4, 8] -> [3, 8]" in text


def test_dtype_change_names_the_dtype():
    with xlasim.simulate("2x2"):
        _train([4, 4], dtype=torch.float32)
        assert recompilations() == []
        _train_more_with_dtype(torch.float64)
        reports = recompilations()
        assert reports, recompilation_report()
        fields = {f for r in reports for c in r.changed_inputs for f in c.fields}
        assert "dtype" in fields
        assert "float32 -> float64" in recompilation_report()


def _train_more_with_dtype(dtype):
    import torch_xla

    device = torch_xla.device()
    w = torch.ones(8, 1).to(device)
    for d in (torch.float32, dtype):
        x = torch.ones(4, 8, dtype=d).to(device)
        y = (x.float() @ w).sum()
        torch_xla.sync()  # SECOND-SITE
        del y


def test_identical_steps_do_not_recompile_and_the_assertion_passes():
    with xlasim.simulate("2x2"):
        import torch_xla.debug.metrics as met

        with assert_no_recompilation() as watch:
            _train([4] * 5)
        assert watch.reports == []
        assert met.counter_value("UncachedCompile") == 1
        assert met.counter_value("CachedCompile") == 4
        assert recompilation_report().startswith("no recompilations (1 graph(s) compiled)")


def test_assertion_fails_with_the_report_and_honours_allowed():
    with xlasim.simulate("2x2"):
        with pytest.raises(RecompilationError) as info, assert_no_recompilation():
            _train([4, 4, 2])
        message = str(info.value)
        assert isinstance(info.value, AssertionError)
        assert "expected no recompilation, got 1" in message
        assert f"{__file__}:{_line_of('CUT-HERE', _train)}" in message
        assert "shape [4, 8] -> [2, 8]" in message
        clear_recompilations()
        with assert_no_recompilation(allowed=1) as watch:
            _train([4, 4, 2])  # cached now: the same three graphs
            _train([5])
        assert len(watch.reports) == 1


def test_an_error_in_the_block_propagates_unchanged():
    with xlasim.simulate("2x2"), pytest.raises(KeyError), assert_no_recompilation():
        raise KeyError("boom")


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1"])
def test_bad_allowed_is_rejected(bad):
    with (
        xlasim.simulate("2x2"),
        pytest.raises(ValueError, match="allowed"),
        assert_no_recompilation(allowed=bad),
    ):
        pass


def test_outside_a_simulation_is_a_clear_error():
    with pytest.raises(RuntimeError, match="no simulated TPU slice is active"):
        recompilations()


def test_site_is_the_users_optimizer_step_through_the_seamless_wrapper():
    from tpu_backend.seamless import SeamlessTPUTrainer

    def loop(batch_sizes):
        trainer = SeamlessTPUTrainer()
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model, opt = trainer.prepare(model, opt)
        for bs in batch_sizes:
            x = trainer.to_device(torch.randn(bs, 8))
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()  # USER-STEP

    with xlasim.simulate("2x2"):
        loop([6, 6, 6, 5])
        (r,) = recompilations()
        assert r.filename == __file__
        assert r.lineno == _line_of("USER-STEP", loop)
        assert "shape [6, 8] -> [5, 8]" in r.describe()
