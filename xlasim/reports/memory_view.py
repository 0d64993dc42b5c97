"""Per-chip HBM use of the active simulated slice as bars in the terminal (rich)."""

from __future__ import annotations

from rich.console import Console
from rich.filesize import pick_unit_and_suffix
from rich.progress_bar import ProgressBar
from rich.table import Table

from xlasim.runtime import memory, state

__all__ = ["chip_memory_table", "show_chip_memory"]

_BINARY_UNITS = ["B", "KiB", "MiB", "GiB", "TiB"]


def _size(nbytes: int) -> str:
    unit, suffix = pick_unit_and_suffix(nbytes, _BINARY_UNITS, 1024)
    return f"{nbytes} B" if unit == 1 else f"{nbytes / unit:.1f} {suffix}"


def chip_memory_table(bar_width: int = 30) -> Table:
    """One row per chip of the active slice: its coordinates, a bar of the HBM it uses,
    the bytes and the share of the chip's HBM (the numbers of :func:`xlasim.chip_memory`)."""
    rt = state.current()
    spec = rt.spec
    slices = f"{rt.num_slices} x " if rt.num_slices > 1 else ""
    table = Table(title=f"HBM per chip, {slices}{spec.pod_type} ({spec.topology})")
    table.add_column("chip", justify="right")
    table.add_column("coords")
    table.add_column("HBM use")
    table.add_column("used", justify="right")
    table.add_column(f"of {_size(spec.hbm_bytes_per_chip)}", justify="right")
    for row in memory.chip_memory():
        bar = ProgressBar(total=row["hbm_bytes"], completed=row["bytes"], width=bar_width)
        coords = ",".join(str(c) for c in row["coords"])
        if "slice_index" in row:
            coords = f"slice {row['slice_index']}: {coords}"
        share = f"{100 * row['fraction']:.1f}%"
        table.add_row(str(row["chip"]), coords, bar, _size(row["bytes"]), share)
    return table


def show_chip_memory(console: Console | None = None) -> Table:
    """Print :func:`chip_memory_table` (to ``console``, default stdout) and return it."""
    table = chip_memory_table()
    (console or Console()).print(table)
    return table
