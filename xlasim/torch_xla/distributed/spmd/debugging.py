"""``torch_xla.distributed.spmd.debugging`` on the simulator: sharding tables with rich.

``visualize_sharding`` is torch_xla 2.9's function; devices are labelled with
``PJRT_DEVICE`` as on the real runtime ('TPU 0', ...).

PYTEST_DONT_REWRITE: the asserts here are torch_xla's API (their messages are compared
with the real ones), so pytest must not rewrite them.
"""

# The parsing below is torch_xla's, kept as is (including its bare excepts and mixed types).
# ruff: noqa: E722, B904, SIM108, F841
# mypy: ignore-errors

from __future__ import annotations

import os
from typing import Any

import torch
import torch_xla
import torch_xla.runtime as xr
from torch_xla.distributed.spmd import XLAShardedTensor
from torch_xla.distributed.spmd.xla_sharding import *  # noqa: F403

try:
    import rich
    import rich.align
    import rich.box
    import rich.console
    import rich.padding
    import rich.style
    import rich.table

    RICH_ENABLED = True
except:
    RICH_ENABLED = False


def visualize_sharding(
    sharding: str,
    use_color: bool = True,
    scale: float = 1.0,
    min_width: int = 9,
    max_width: int = 80,
) -> Any:
    """Visualizes a sharding spec string (first two dimensions) with ``rich``; returns the
    table after printing it."""
    if not RICH_ENABLED:
        raise ValueError("`visualize_sharding` requires `rich` to be installed.")

    slices: dict[tuple[int, ...], Any] = {}
    heights: Any = {}
    widths: Any = {}

    if len(sharding) >= 0:
        # eg: '{devices=[2,2]0,1,2,3}'
        # eg: '{replicated}'
        # eg: '{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}'
        print(f"Visualizing {sharding} (showing up to the first two dimensions)")
        if sharding == "{replicated}" or len(sharding) == 0:
            heights = 1
            widths = 1
            num_devices = xr.global_runtime_device_count()
            device_ids = list(range(num_devices))
            slices.setdefault((0, 0), device_ids)
        else:
            sharding_spec = sharding[sharding.index("[") + 1 : sharding.index("]")].split(",")
            device_list_original = sharding.split(" last_tile_dim_replicate")
            if len(device_list_original) == 2 and device_list_original[1] == "}":
                try:
                    device_list_original_first = device_list_original[0]
                    device_list = device_list_original_first[
                        device_list_original_first.index("]") + 1 :
                    ]
                    device_indices_map = [int(s) for s in device_list.split(",")]
                    heights = int(sharding_spec[0])
                    widths = int(sharding_spec[1])
                    last_dim_depth = int(sharding_spec[-1])
                    devices_len = len(device_indices_map)
                    len_after_dim_down = devices_len // last_dim_depth
                    for i in range(len_after_dim_down):
                        slices.setdefault(
                            (i // widths, i % widths),
                            device_indices_map[i * last_dim_depth : (i + 1) * last_dim_depth],
                        )
                except:
                    raise ValueError("sharding ", sharding, " is not organized as expected")
            else:
                # eg: '{devices=[2,2]0,1,2,3}'
                try:
                    assert device_list_original[0][-1] == "}"
                except:
                    raise ValueError("sharding ", sharding, " is not organized as expected")
                try:
                    device_list_original_first = device_list_original[0]
                    device_list = device_list_original_first[
                        device_list_original_first.index("]") + 1 : -1
                    ]
                    device_indices_map = [int(i) for i in device_list.split(",")]
                    heights = int(sharding_spec[0])
                    widths = int(sharding_spec[1])
                    devices_len = len(device_indices_map)
                    for i in range(devices_len):
                        slices.setdefault((i // widths, i % widths), device_indices_map[i])
                except:
                    raise ValueError("sharding ", sharding, " is not organized as expected")
    else:
        raise ValueError("sharding length should >= 0")

    num_rows = heights
    num_cols = widths

    console = rich.console.Console(width=max_width)
    use_color = use_color and console.color_system is not None

    base_height = int(3 * scale)
    aspect_ratio = 1
    base_width = int(base_height * aspect_ratio)
    height_to_width_ratio = 1.5

    pjrt_device = os.environ.get("PJRT_DEVICE")
    device_kind = pjrt_device

    table = rich.table.Table(
        show_header=False,
        show_lines=not use_color,
        padding=0,
        highlight=not use_color,
        pad_edge=False,
        box=rich.box.SQUARE if not use_color else None,
    )
    for i in range(num_rows):
        col = []
        for j in range(num_cols):
            entry = f"{device_kind} " + str(slices[i, j])
            width, maybe_height = widths, heights
            width = int(width * base_width * height_to_width_ratio)
            if maybe_height is None:
                height = 1
            else:
                height = int(maybe_height * base_height)
            width = min(max(width, min_width), max_width)

            color = None
            text_color = None

            padding = (1, 1, 1, 1)

            col.append(
                rich.padding.Padding(
                    rich.align.Align(entry, "center", vertical="middle"),
                    padding,
                    style=rich.style.Style(bgcolor=color, color=text_color),
                )
            )
        table.add_row(*col)
    console.print(table, end="\n\n")
    return table


def visualize_tensor_sharding(t: torch.Tensor, **kwargs: Any) -> Any:
    """Visualizes an array's sharding."""

    def maybe_unwrap(t: torch.Tensor) -> torch.Tensor:
        return t.global_tensor if isinstance(t, XLAShardedTensor) else t

    sharding = torch_xla._XLAC._get_xla_sharding_spec(maybe_unwrap(t))
    return visualize_sharding(sharding, **kwargs)
