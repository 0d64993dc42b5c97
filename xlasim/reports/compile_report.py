"""What the real TPU compiler said about each graph: ``xlasim.compiled_graphs()`` and its table.

Only a simulation entered with ``compiler="libtpu"`` (or ``XLASIM_COMPILER=libtpu``,
``xlasim run --compiler libtpu``) has these figures; see docs/will-it-fit.md.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from xlasim.runtime import state
from xlasim.runtime.graph import CompiledGraph
from xlasim.runtime.memory import human_bytes


def _compiled(runtime: Any) -> list[CompiledGraph]:
    compiler = runtime.graphs.compiler
    if compiler is None:
        raise RuntimeError(
            "xlasim: no TPU compiler is attached to this simulation; enter it with "
            "xlasim.simulate(..., compiler='libtpu'), XLASIM_COMPILER=libtpu or "
            "`xlasim run --compiler libtpu`"
        )
    return list(compiler.compiled.values())


def compiled_graphs() -> list[CompiledGraph]:
    """libtpu's figures for every graph compiled in the active simulation, in compile order.

    Each entry holds the graph hash, the user's line that cut it, per-device argument, output,
    alias, temporary and program bytes (``peak_bytes`` adds them up), the compiler's estimate
    of FLOPs and bytes accessed, compile time, and ``step_seconds``, a roofline estimate from
    the generation's peak FLOP/s and HBM bandwidth.
    """
    return _compiled(state.current())


def _site(site: str) -> str:
    # "path/to/train.py:42 in main" -> "train.py:42": the column stays readable.
    return os.path.basename(site.split(" in ", 1)[0])


def report_table(runtime: Any) -> Table:
    spec = runtime.spec
    per = "device" if spec.devices_per_chip == 1 else f"device ({spec.devices_per_chip}/chip)"
    table = Table(
        title=f"Graphs compiled by libtpu for {spec.accelerator} {spec.topology} "
        f"({spec.num_devices} devices), per {per}",
        caption="Bytes per device; FLOPs and bytes accessed are the compiler's estimate; step "
        "time is a roofline (max of FLOPs / peak bf16 FLOP/s and bytes / HBM bandwidth): a "
        "lower bound without collectives",
    )
    for column in ("graph", "cut at", "args", "out", "alias", "temp", "code", "peak", "HBM"):
        table.add_column(column, justify="left" if column in ("graph", "cut at") else "right")
    for column in ("GFLOP", "GB accessed", "step ms", "compile s"):
        table.add_column(column, justify="right")
    for g in _compiled(runtime):
        table.add_row(
            f"{g.key & 0xFFFFFFFF:08x}",
            _site(g.site),
            human_bytes(g.argument_bytes),
            human_bytes(g.output_bytes),
            human_bytes(g.alias_bytes),
            human_bytes(g.temp_bytes),
            human_bytes(g.generated_code_bytes),
            human_bytes(g.peak_bytes),
            human_bytes(g.hbm_bytes),
            f"{g.flops / 1e9:.3g}",
            f"{g.bytes_accessed / 1e9:.3g}",
            f"{g.step_seconds * 1e3:.3g}",
            f"{g.compile_seconds:.1f}",
        )
    return table


def _console(file: Any) -> Console:
    console = Console(file=file)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        # A file or pipe has no width; rich's default of 80 would cut every column to "…".
        console.width = _FILE_WIDTH
    return console


_FILE_WIDTH = 160


def compiled_graphs_report(file: Any = None) -> None:
    """Prints :func:`compiled_graphs` as a table (to ``file``, default stdout)."""
    _console(file).print(report_table(state.current()))


def print_at_exit(runtime: Any) -> None:
    """What ``xlasim run --compiler`` shows when the program ends (on stderr)."""
    if runtime.graphs.compiler is not None:
        _console(sys.stderr).print(report_table(runtime))
