"""A simulated slice as a two-column table (``xlasim describe`` and ``xlasim demo``)."""

from __future__ import annotations

from rich.table import Table

from tpu_backend.topology import SliceSpec


def slice_table(spec: SliceSpec) -> Table:
    table = Table(title=f"Simulated slice {spec.pod_type} ({spec.topology})", show_header=False)
    table.add_column("property", style="bold")
    table.add_column("value")
    for label, value in spec.describe_rows():
        table.add_row(label, value)
    return table
