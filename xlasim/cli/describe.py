"""A simulated slice in the terminal (``xlasim describe`` and ``xlasim demo``): its facts as a
two-column table, and its chips on the torus."""

from __future__ import annotations

import numpy as np
from rich.table import Table
from rich.text import Text

from tpu_backend.topology import SliceSpec, default_mesh
from xlasim.sharding.device_layout import device_attributes


def slice_table(spec: SliceSpec) -> Table:
    table = Table(title=f"Simulated slice {spec.pod_type} ({spec.topology})", show_header=False)
    table.add_column("property", style="bold")
    table.add_column("value")
    for label, value in spec.describe_rows():
        table.add_row(label, value)
    return table


# One colour per host, repeating: neighbouring hosts differ.
_HOST_STYLES = ("cyan", "magenta", "green", "yellow", "blue", "red")
# Beyond this many chips the grid would not fit a terminal; describe says so instead.
MAX_GRID_CHIPS = 256


def chip_grids(spec: SliceSpec) -> list[Table]:
    """The slice's chips where they sit on the torus, one x-by-y grid per z plane: each
    cell names the chip's host, its devices (``TPU:<id>``, the ids of
    ``xr.global_runtime_device_attributes()``) and their place in the default SPMD mesh."""
    mesh_shape, mesh_axes = default_mesh(spec)
    mesh_index = np.arange(spec.num_devices).reshape(mesh_shape)
    position = {int(d): f"({','.join(map(str, idx))})" for idx, d in np.ndenumerate(mesh_index)}
    cells: dict[tuple[int, int, int], list[int]] = {}
    for device, attrs in enumerate(device_attributes(spec)):
        cells.setdefault(tuple(attrs["coords"]), []).append(device)
    size_x, size_y, size_z = (max(c[i] for c in cells) + 1 for i in range(3))
    axes = ",".join(mesh_axes)
    grids = []
    for z in range(size_z):
        title = f"z={z}: chips by x (across) and y (down); TPU:id (position in mesh {axes})"
        grid = Table(title=title, show_header=True, show_lines=True)
        grid.add_column("y \\ x", justify="right")
        for x in range(size_x):
            grid.add_column(str(x), justify="center")
        for y in range(size_y):
            row = []
            for x in range(size_x):
                devices = cells[(x, y, z)]
                host = devices[0] // spec.devices_per_host
                lines = [f"host {host}"]
                lines += [f"TPU:{d} {position[d]}" for d in devices]
                row.append(Text("\n".join(lines), style=_HOST_STYLES[host % len(_HOST_STYLES)]))
            grid.add_row(str(y), *row)
        grids.append(grid)
    return grids
