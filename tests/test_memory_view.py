"""xlasim.show_chip_memory(): the per-chip HBM table a user prints in the terminal."""

from __future__ import annotations

import numpy as np
import torch
from rich.console import Console

import xlasim


def _rendered_rows() -> list[list[str]]:
    console = Console(record=True, width=120, color_system=None)
    xlasim.show_chip_memory(console)
    lines = console.export_text().splitlines()
    return [[cell.strip() for cell in line.split("│")[1:-1]] for line in lines if "│" in line]


def test_table_shows_each_chips_bytes_and_share() -> None:
    with xlasim.simulate("2x2", "v5e"):  # 4 chips of 16 GiB
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        xr.use_spmd()
        replicated = torch.zeros(1024, 1024).to("xla")  # 4 MiB on every chip
        sharded = torch.zeros(4096, 1024).to("xla")  # 16 MiB, a quarter per chip
        xs.mark_sharding(sharded, xs.Mesh(np.arange(4), (4,), ("data",)), ("data", None))
        big = torch.zeros(2**30, dtype=torch.uint8).to("xla")  # 1 GiB replicated
        rows = _rendered_rows()
        del replicated, sharded, big
    # chip, coords, bar, used, share of 16 GiB: (4 + 4 + 1024) MiB = 1032 MiB = 6.3%
    assert [(r[0], r[3], r[4]) for r in rows] == [(str(c), "1.0 GiB", "6.3%") for c in range(4)]
    assert sorted(r[1] for r in rows) == ["0,0,0", "0,1,0", "1,0,0", "1,1,0"]
