"""docs/support-matrix.md is what the simulator's code gives, and the classes mean what they say."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import xlasim
from xlasim.reports import support_matrix as sm


def test_committed_page_is_up_to_date(capsys: pytest.CaptureFixture[str]) -> None:
    # Fails after a change to the simulated surface until `python -m xlasim.reports.support_matrix
    # write` is run and its page committed.
    # The checkout's page: where the package is installed as a wheel (CI), DOC_FILE's default
    # points into site-packages.
    page = Path(__file__).resolve().parents[1] / "docs" / "support-matrix.md"
    assert sm.main(["check", "--doc", str(page)]) == 0, capsys.readouterr().out


def _always() -> None:
    raise NotImplementedError("always")


def _only_with_flag(flag: bool) -> int:
    if flag:
        raise NotImplementedError("flag")
    return 1


def _builds_error(name: str) -> Exception:
    if not name:
        return ValueError(name)
    return NotImplementedError(name)


def _through_helper(n: int) -> int:
    if n > 1:
        raise _builds_error("n > 1")
    return n


def _checks_then_refuses(n: int) -> None:
    if n < 0:
        raise ValueError(n)
    raise NotImplementedError("refuses")


class _PartlyClass:
    def ok(self) -> int:
        return 1

    def refuses(self) -> None:
        raise NotImplementedError("refuses")


class _WholeClass:
    def ok(self) -> int:
        return 1


class _UnmadeClass:
    """No instance can be made, whatever its other methods do."""

    def __init__(self) -> None:
        raise NotImplementedError("refuses")

    def ok(self) -> int:
        return 1


def _plain(n: int) -> int:
    if n < 0:
        raise ValueError(n)
    return n


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (_always, sm.NOT_IMPLEMENTED),
        (_checks_then_refuses, sm.NOT_IMPLEMENTED),
        (_only_with_flag, sm.PARTLY),
        (_through_helper, sm.PARTLY),
        (_PartlyClass, sm.PARTLY),
        (_WholeClass, sm.SIMULATED),
        (_UnmadeClass, sm.NOT_IMPLEMENTED),
        (_plain, sm.SIMULATED),
        (42, sm.SIMULATED),
    ],
    ids=lambda v: getattr(v, "__name__", repr(v)),
)
def test_status_of_reads_the_code(value: object, expected: str) -> None:
    assert sm.status_of(value) == expected


def test_recorded_names_parse() -> None:
    modules = sm.read_names(sm.NAMES_FILE.read_text(encoding="utf-8"))
    assert "mark_step" in (modules["torch_xla.core.xla_model"] or [])
    assert "mark_sharding" in (modules["torch_xla.distributed.spmd"] or [])
    # Recorded as not importing on CPU, so not counted at all.
    assert modules["torch_xla.tf_saved_model_integration"] is None


def test_classes_match_behaviour() -> None:
    modules = {
        "torch_xla.core.xla_model": ["mark_step", "all_reduce", "no_such_name"],
        "torch_xla.distributed.spmd": ["enable_manual_sharding"],
        "torch_xla.experimental.pytreeify": ["pytreeify"],
    }
    with xlasim.simulate(topology="2x2"):
        entries = {(e.module, e.name): e.status for e in sm.classify(modules)}
        import torch_xla.core.xla_model as xm
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        # all_reduce is simulated at every world size (one replica returns its input).
        assert xm.all_reduce(xm.REDUCE_SUM, [1.0]) == [1.0]
        # enable_manual_sharding runs: the binding it calls no longer refuses.
        xr.use_spmd()
        t = torch.zeros(4, 4).to("xla")
        mesh = xs.Mesh(np.arange(4), (4,), ("data",))
        assert xs.enable_manual_sharding(t, ("data", None), mesh=mesh).shape == (1, 4)
    assert entries == {
        ("torch_xla.core.xla_model", None): sm.SIMULATED,
        ("torch_xla.core.xla_model", "mark_step"): sm.SIMULATED,
        ("torch_xla.core.xla_model", "all_reduce"): sm.SIMULATED,
        ("torch_xla.core.xla_model", "no_such_name"): sm.ABSENT,
        ("torch_xla.distributed.spmd", None): sm.SIMULATED,
        ("torch_xla.distributed.spmd", "enable_manual_sharding"): sm.SIMULATED,
        ("torch_xla.experimental.pytreeify", None): sm.ABSENT,
    }
    with (
        xlasim.simulate(topology="2x2"),
        pytest.raises(ModuleNotFoundError, match="support-matrix"),
    ):
        import torch_xla.experimental.pytreeify  # noqa: F401
