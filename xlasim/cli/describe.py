"""A simulated slice in the terminal (``xlasim describe`` and ``xlasim demo``): its facts as a
two-column table, and its chips on the torus."""

from __future__ import annotations

import numpy as np
from rich.table import Table
from rich.text import Text

from tpu_backend.topology import SliceSpec, default_mesh_for
from xlasim.sharding.device_layout import device_attributes


def slice_table(spec: SliceSpec, num_slices: int = 1) -> Table:
    if num_slices == 1:
        title = f"Simulated slice {spec.pod_type} ({spec.topology})"
    else:
        title = f"Simulated multislice job: {num_slices} x {spec.pod_type} ({spec.topology})"
    table = Table(title=title, show_header=False)
    table.add_column("property", style="bold")
    table.add_column("value")
    for label, value in spec.describe_rows():
        if num_slices > 1 and label == "default mesh":
            continue  # the whole job's mesh follows below
        table.add_row(label if num_slices == 1 else f"{label} (per slice)", value)
    if num_slices > 1:
        shape, axes = multislice_mesh(spec, num_slices)
        mesh = ", ".join(f"{a}={n}" for a, n in zip(axes, shape, strict=True))
        table.add_row("slices (joined over DCN)", str(num_slices))
        table.add_row("hosts (all slices)", str(spec.num_hosts * num_slices))
        table.add_row("devices (all slices)", str(spec.num_devices * num_slices))
        table.add_row("default mesh", f"({mesh})")
    return table


def multislice_mesh(spec: SliceSpec, num_slices: int) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The default mesh of ``num_slices`` slices: data parallel over every host of every
    slice, each host's devices on the model axis (one slice: the slice's default mesh)."""
    return default_mesh_for(spec.num_devices * num_slices, spec.num_hosts * num_slices)


# One colour per host, repeating: neighbouring hosts differ.
_HOST_STYLES = ("cyan", "magenta", "green", "yellow", "blue", "red")
# Beyond this many chips the grid would not fit a terminal; describe says so instead.
MAX_GRID_CHIPS = 256


def chip_grids(spec: SliceSpec, num_slices: int = 1) -> list[Table]:
    """The slice's chips where they sit on the torus, one x-by-y grid per z plane (and per
    slice): each cell names the chip's host, its devices (``TPU:<id>``, the ids of
    ``xr.global_runtime_device_attributes()``) and their place in the default SPMD mesh."""
    mesh_shape, mesh_axes = multislice_mesh(spec, num_slices)
    mesh_index = np.arange(spec.num_devices * num_slices).reshape(mesh_shape)
    position = {int(d): f"({','.join(map(str, idx))})" for idx, d in np.ndenumerate(mesh_index)}
    grids = []
    for slice_index in range(num_slices):
        grids += _slice_grids(spec, num_slices, slice_index, position, ",".join(mesh_axes))
    return grids


def _slice_grids(
    spec: SliceSpec, num_slices: int, slice_index: int, position: dict[int, str], axes: str
) -> list[Table]:
    cells: dict[tuple[int, int, int], list[int]] = {}
    for device, attrs in enumerate(device_attributes(spec, num_slices)):
        if attrs.get("slice_index", 0) == slice_index:
            cells.setdefault(tuple(attrs["coords"]), []).append(device)
    size_x, size_y, size_z = (max(c[i] for c in cells) + 1 for i in range(3))
    where = f"slice {slice_index}, " if num_slices > 1 else ""
    grids = []
    for z in range(size_z):
        title = f"{where}z={z}: chips by x (across) and y (down); TPU:id (position in mesh {axes})"
        grid = Table(title=title, show_header=True, show_lines=True)
        grid.add_column("y \\ x", justify="right")
        for x in range(size_x):
            grid.add_column(str(x), justify="center")
        for y in range(size_y):
            row = []
            for x in range(size_x):
                devices = cells[(x, y, z)]
                # Hosts are numbered within their slice (TPU_WORKER_ID), colours across slices.
                process = devices[0] // spec.devices_per_host
                host = process % spec.num_hosts
                lines = [f"host {host}"]
                lines += [f"TPU:{d} {position[d]}" for d in devices]
                row.append(Text("\n".join(lines), style=_HOST_STYLES[process % len(_HOST_STYLES)]))
            grid.add_row(str(y), *row)
        grids.append(grid)
    return grids
