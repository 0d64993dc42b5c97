"""``torch_xla.distributed.spmd.debugging`` on the simulator: sharding tables with rich.

Tables show the first two dimensions of a sharding, each cell naming the device(s) holding that
tile, labelled with ``PJRT_DEVICE`` as on the real runtime ('TPU 0', 'TPU [0, 1]').
"""

from __future__ import annotations

import os
import re
from typing import Any

import torch
import torch_xla
import torch_xla.runtime as xr
from torch_xla.distributed.spmd.xla_sharded_tensor import XLAShardedTensor

_TILED = re.compile(r"^\{devices=\[([\d,]+)\]([\d,]+)( last_tile_dim_replicate)?\}$")


def _not_organized(sharding: str) -> ValueError:
    # torch_xla raises it with the pieces as separate arguments; so do we.
    return ValueError("sharding ", sharding, " is not organized as expected")


def _tile_grid(sharding: str) -> tuple[int, int, dict[tuple[int, int], Any]]:
    """(rows, columns, cell -> device id or list of replica device ids)."""
    if sharding in ("", "{replicated}"):
        return 1, 1, {(0, 0): list(range(xr.global_runtime_device_count()))}
    match = _TILED.match(sharding)
    if match is None:
        raise _not_organized(sharding)
    dims = [int(d) for d in match.group(1).split(",")]
    devices = [int(d) for d in match.group(2).split(",")]
    if len(dims) < 2:
        raise _not_organized(sharding)
    rows, cols = dims[0], dims[1]
    # With replication the last tile dimension lists the replicas of each tile.
    group = dims[-1] if match.group(3) else 1
    cells: dict[tuple[int, int], Any] = {}
    for tile in range(len(devices) // group):
        held = devices[tile * group : (tile + 1) * group]
        cells.setdefault((tile // cols, tile % cols), held if match.group(3) else held[0])
    return rows, cols, cells


def visualize_sharding(
    sharding: str,
    use_color: bool = True,
    scale: float = 1.0,
    min_width: int = 9,
    max_width: int = 80,
) -> Any:
    """Prints a sharding spec string as a table (first two dimensions) and returns it."""
    try:
        # Deferred, with torch_xla's message: rich is optional for torch_xla.
        from rich.align import Align
        from rich.box import SQUARE
        from rich.console import Console
        from rich.padding import Padding
        from rich.table import Table
    except ImportError:
        raise ValueError("`visualize_sharding` requires `rich` to be installed.") from None

    print(f"Visualizing {sharding} (showing up to the first two dimensions)")
    rows, cols, cells = _tile_grid(sharding)
    console = Console(width=max_width)
    colored = use_color and console.color_system is not None
    table = Table(
        show_header=False,
        show_lines=not colored,
        padding=0,
        highlight=not colored,
        pad_edge=False,
        box=None if colored else SQUARE,
    )
    label = os.environ.get("PJRT_DEVICE")
    for row in range(rows):
        table.add_row(
            *(
                Padding(
                    Align(f"{label} {cells[row, col]}", "center", vertical="middle"), (1, 1, 1, 1)
                )
                for col in range(cols)
            )
        )
    console.print(table, end="\n\n")
    return table


def visualize_tensor_sharding(t: torch.Tensor, **kwargs: Any) -> Any:
    """Visualizes a tensor's sharding (an ``XLAShardedTensor`` or an annotated xla tensor)."""
    wrapped = isinstance(t, XLAShardedTensor)
    spec = t.sharding_spec if wrapped else torch_xla._XLAC._get_xla_sharding_spec(t)  # type: ignore[attr-defined]
    return visualize_sharding(spec, **kwargs)
