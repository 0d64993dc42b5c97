"""Counters and metrics under torch_xla's own names.

Only the names the simulator can account for honestly are ever created; a name that real
torch_xla would report but the simulator cannot reproduce (``CreateXlaTensor``...) is never
invented. The ``xla::<kernel>`` counter of each XLA kernel call is counted where the op is
dispatched (``kernel_counters``), and those of the collective bindings (``xla::AllGather``,
``xla::all_reduce``...) where the simulated collective runs.
Not yet accounted: under SPMD, a tensor whose upload torch_xla deferred from ``.to('xla')``
and that is still on the host at a sync is uploaded by torch_xla then; the simulator records
that upload only at the tensor's first use.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

# Real torch_xla keeps a bounded circular buffer of samples per metric.
_MAX_SAMPLES = 1024

# Metrics whose values are durations (nanoseconds), formatted like torch_xla's reports.
TIME_METRICS = frozenset(
    {
        "CompileTime",
        "ExecuteTime",
        "TransferToDeviceTime",
        "TransferFromDeviceTime",
        "TensorToData",
        "ExecuteReplicatedTime",
        "PersistentCacheLoad",
    }
)

# Metrics whose values are byte counts, formatted like torch_xla's reports (``1.17KB``).
BYTE_METRICS = frozenset({"InboundData", "OutboundData"})


@dataclass
class _Metric:
    total: int = 0
    accumulator: float = 0.0
    samples: list[tuple[float, float]] = field(default_factory=list)

    def add(self, value: float) -> None:
        self.total += 1
        self.accumulator += value
        # torch_xla reports when a sample was taken in seconds since the epoch.
        self.samples.append((time.time(), float(value)))
        if len(self.samples) > _MAX_SAMPLES:
            del self.samples[0]


class Metrics:
    """The counters/metrics store of one simulated process."""

    def __init__(self) -> None:
        # torch_xla registers its XLA kernels with PyTorch once per process, when it is
        # imported, and counts that (real torch_xla 2.9: 1 right after import, until cleared).
        self._counters: dict[str, int] = {"RegisterXLAFunctions": 1}
        self._metrics: dict[str, _Metric] = {}

    def inc(self, name: str, by: int = 1) -> None:
        self._counters[name] = self._counters.get(name, 0) + by

    def to_device(self, nbytes: int, start_ns: int) -> None:
        """One host-to-device transfer call (of one or several tensors) that began at
        ``start_ns``: torch_xla times it and counts the bytes its buffers take on the devices."""
        elapsed = time.perf_counter_ns() - start_ns
        self.add_sample("TensorToData", elapsed)
        self.add_sample("OutboundData", nbytes)
        self.add_sample("TransferToDeviceTime", elapsed)

    def from_device(self, nbytes: int, start_ns: int) -> None:
        """One device-to-host transfer of a tensor of ``nbytes`` (its global size)."""
        self.add_sample("InboundData", nbytes)
        self.add_sample("TransferFromDeviceTime", time.perf_counter_ns() - start_ns)

    def add_sample(self, name: str, value: float) -> None:
        metric = self._metrics.get(name)
        if metric is None:
            metric = self._metrics[name] = _Metric()
        metric.add(value)

    # Real torch_xla hides zero-valued counters and empty metrics after a clear.
    def counter_names(self) -> list[str]:
        return [n for n, v in self._counters.items() if v]

    def counter_value(self, name: str) -> int | None:
        value = self._counters.get(name)
        return value or None

    def metric_names(self) -> list[str]:
        return [n for n, m in self._metrics.items() if m.total]

    def metric_data(self, name: str) -> tuple[int, float, tuple[tuple[float, float], ...]] | None:
        metric = self._metrics.get(name)
        if metric is None or not metric.total:
            return None
        return metric.total, metric.accumulator, tuple(metric.samples)

    def fallback_ops(self) -> list[str]:
        # torch_xla counts each op it ran on the CPU under its aten:: name.
        return [n for n in self.counter_names() if n.startswith("aten::")]

    def clear_counters(self) -> None:
        self._counters.clear()

    def clear_metrics(self) -> None:
        self._metrics.clear()

    def report(
        self, counter_names: list[str] | None = None, metric_names: list[str] | None = None
    ) -> str:
        lines: list[str] = []
        for name in metric_names if metric_names is not None else self.metric_names():
            data = self.metric_data(name)
            if data is None:
                continue
            total, acc, samples = data
            fmt = (
                _format_ns
                if name in TIME_METRICS
                else _format_bytes
                if name in BYTE_METRICS
                else _format_plain
            )
            lines.append(f"Metric: {name}")
            lines.append(f"  TotalSamples: {total}")
            lines.append(f"  Accumulator: {fmt(acc)}")
            values = sorted(v for _, v in samples)
            pct = "; ".join(
                f"{p}%={fmt(values[min(len(values) - 1, int(len(values) * p / 100))])}"
                for p in (1, 5, 10, 20, 50, 80, 90, 95, 99)
            )
            lines.append(f"  Percentiles: {pct}")
        counters = self.counter_names() if counter_names is None else list(counter_names)
        if counter_names is not None:
            # A short report always lists the CPU fallbacks too (torch_xla's ``aten::`` ones).
            counters += [n for n in self.fallback_ops() if n not in counters]
        for name in counters:
            value = self.counter_value(name)
            if value is None:
                continue
            lines.append(f"Counter: {name}")
            lines.append(f"  Value: {value}")
        return "\n".join(lines) + ("\n" if lines else "")


def _format_plain(value: float) -> str:
    return f"{value:g}"


def _format_bytes(value: float) -> str:
    """Formats a byte count the way torch_xla's metrics report does: two decimals of the
    largest binary unit that keeps the number at or above 1 (``4.00B``, ``1.17KB``)."""
    units = ("B", "KB", "MB", "GB", "TB", "PB")
    index = 0
    while value >= 1024 and index < len(units) - 1:
        value /= 1024
        index += 1
    return f"{value:.2f}{units[index]}"


def _format_ns(value: float) -> str:
    """Formats nanoseconds the way torch_xla's metrics report does (e.g. ``031ms331.307us``)."""
    ns = int(value)
    parts: list[str] = []
    for unit, size in (("s", 10**9), ("ms", 10**6)):
        if ns >= size or parts:
            parts.append(f"{ns // size:02d}{unit}" if not parts else f"{ns // size:03d}{unit}")
            ns %= size
    parts.append(f"{ns // 1000:03d}.{ns % 1000:03d}us")
    return "".join(parts)
