"""Simulated ``torch_xla.debug.metrics``: the same functions over the simulator's metrics."""

from __future__ import annotations

from typing import Any

import torch_xla


def counter_names() -> list[str]:
    return torch_xla._XLAC._xla_counter_names()


def counter_value(name: str) -> int | None:
    return torch_xla._XLAC._xla_counter_value(name)


def clear_counters() -> None:
    return torch_xla._XLAC._clear_xla_counters()


def metric_names() -> list[str]:
    return torch_xla._XLAC._xla_metric_names()


def metric_data(name: str) -> Any:
    return torch_xla._XLAC._xla_metric_data(name)


def clear_metrics() -> None:
    return torch_xla._XLAC._clear_xla_metrics()


def clear_all() -> None:
    clear_metrics()
    clear_counters()


def metrics_report() -> str:
    return torch_xla._XLAC._xla_metrics_report()


def short_metrics_report(
    counter_names: list[str] | None = None, metric_names: list[str] | None = None
) -> str:
    if not counter_names:
        counter_names = ["CachedCompile", "MarkStep", "DynamoSyncInputExecuteTime"]
    if not metric_names:
        metric_names = [
            "CompileTime",
            "ExecuteTime",
            "ExecuteReplicatedTime",
            "TransferToDeviceTime",
            "TransferFromDeviceTime",
        ]
    return torch_xla._XLAC._short_xla_metrics_report(counter_names, metric_names)


def executed_fallback_ops() -> list[str]:
    return torch_xla._XLAC._get_executed_fallback_ops()
