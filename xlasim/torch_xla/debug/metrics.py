"""Simulated ``torch_xla.debug.metrics``: the same functions over the simulator's metrics."""

from __future__ import annotations

from typing import Any

from xlasim.runtime import metrics as _metrics
from xlasim.runtime import state as _runtime

# What short_metrics_report shows when it is given no (or empty) name lists.
_SHORT_COUNTERS = ("CachedCompile", "MarkStep", "DynamoSyncInputExecuteTime")
_SHORT_METRICS = (
    "CompileTime",
    "ExecuteTime",
    "ExecuteReplicatedTime",
    "TransferToDeviceTime",
    "TransferFromDeviceTime",
)


def _store() -> _metrics.Metrics:
    return _runtime.current().metrics


def counter_names() -> list[str]:
    return _store().counter_names()


def counter_value(name: str) -> int | None:
    return _store().counter_value(name)


def clear_counters() -> None:
    _store().clear_counters()


def metric_names() -> list[str]:
    return _store().metric_names()


def metric_data(name: str) -> Any:
    return _store().metric_data(name)


def clear_metrics() -> None:
    _store().clear_metrics()


def clear_all() -> None:
    store = _store()
    store.clear_counters()
    store.clear_metrics()


def metrics_report() -> str:
    return _store().report()


def short_metrics_report(
    counter_names: list[str] | None = None, metric_names: list[str] | None = None
) -> str:
    """The report restricted to the given names (a short default list for either when empty)."""
    counters = list(counter_names or _SHORT_COUNTERS)
    metrics = list(metric_names or _SHORT_METRICS)
    return _store().report(counters, metrics)


def executed_fallback_ops() -> list[str]:
    return _store().fallback_ops()
