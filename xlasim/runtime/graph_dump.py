"""``XLA_SAVE_TENSORS_FILE``: every graph the program syncs, appended to a file as torch_xla 2.9
writes it.

torch_xla reads the two variables once, at the first graph it syncs: ``XLA_SAVE_TENSORS_FILE``
names the file (written as ``<name>.<ordinal of the default device>``, appended to) and
``XLA_SAVE_TENSORS_FMT`` the format (``text``, the default: the IR as
``_get_xla_tensors_text`` prints it; ``hlo``: the HLO module as ``_get_xla_tensors_hlo``
prints it; ``dot`` and ``stablehlo`` are not simulated: their blocks say so instead; any other
name fails the first sync with torch_xla's error).

Each graph is one block (measured on torch_xla 2.9, CPU): a ``[ScheduleSyncTensorsGraph]``
title, the Python frames that asked for the values (innermost first), the roots' hashes, the
graph between ``## BEGIN_GRAPH`` and ``## END_GRAPH`` with its hash, and under SPMD in the
``hlo`` format the outputs' shardings between ``#OUTPUT_SHARDING_BEGIN`` and
``#OUTPUT_SHARDING_END``. A graph is written each time it runs, compiled or found in the
cache (eager mode's one-op graphs included).

Hashes are the simulator's own, in torch_xla's format. A graph holding an op whose text the
simulator does not write is written with the simulator's NotImplementedError message in place
of its text: the dump stays complete and says what it leaves out.
"""

from __future__ import annotations

import os
from typing import Any

from xlasim.runtime import debug_analysis, ir_text
from xlasim.runtime.compiler.hlo_text import tensors_hlo
from xlasim.runtime.errors import xla_type
from xlasim.runtime.state import SimRuntime

_WRITTEN = ("text", "hlo")
_UNWRITTEN = ("dot", "stablehlo")  # torch_xla's other formats


class GraphDump:
    """The dump of one runtime's graphs; inert until ``XLA_SAVE_TENSORS_FILE`` is set."""

    def __init__(self, runtime: SimRuntime) -> None:
        self._runtime = runtime
        self._path: str | None = None
        self._format = "text"
        self._resolved = False

    def _target(self) -> str | None:
        if not self._resolved:  # torch_xla reads the variables once, at the first graph
            self._resolved = True
            base = os.environ.get("XLA_SAVE_TENSORS_FILE", "")
            fmt = os.environ.get("XLA_SAVE_TENSORS_FMT", "text") or "text"
            if base and fmt not in _WRITTEN + _UNWRITTEN:
                raise RuntimeError(f"Invalid save graph format: {fmt}")  # torch_xla's text
            self._format = fmt
            if base:
                self._path = f"{base}.{self._runtime.default_device_index}"
        return self._path

    def before_run(self, tensors: list[Any], key: int) -> str | None:
        """The block of the graph about to run for ``tensors`` (still pending), or None when
        nothing is dumped."""
        if self._target() is None:
            return None
        frames = "".join(
            f"  {name} ({path}:{line})\n" for name, path, line in debug_analysis.python_frames()
        )
        roots = ", ".join(debug_analysis.hash_text(t._node.hash) for t in tensors)
        try:
            if self._format in _UNWRITTEN:
                raise NotImplementedError(
                    f"xlasim does not simulate the {self._format} format of graph dumps "
                    f"(XLA_SAVE_TENSORS_FMT={self._format}); it writes {' and '.join(_WRITTEN)}"
                )
            if self._format == "hlo":
                graph = tensors_hlo(self._runtime, tensors)
            else:
                rt = self._runtime
                graph = ir_text.tensors_text(tensors, rt.float_storage, rt.long_storage)
        except NotImplementedError as exc:
            graph = f"{exc}\n"
        return (
            "[ScheduleSyncTensorsGraph]\nTensorsGraphInfo:\n"
            f"{frames}\nRoot Hashes: ({roots})\n\n## BEGIN_GRAPH\n{graph}\n"
            f"Graph Hash: {debug_analysis.hash_text(key)}\n\n## END_GRAPH\n\n"
        )

    def after_run(self, block: str, tensors: list[Any], spmd: bool) -> None:
        """Appends ``block`` with, under SPMD in the ``hlo`` format, the shardings the run gave
        the outputs."""
        if spmd and self._format == "hlo":
            lines = "".join(
                f"{xla_type(t.dtype)}[{','.join(map(str, t.shape))}] {_spec(t)}\n" for t in tensors
            )
            block += f"\n#OUTPUT_SHARDING_BEGIN\n\n{lines}\n#OUTPUT_SHARDING_END\n\n"
        assert self._path is not None
        with open(self._path, "a", encoding="utf-8") as out:
            out.write(block)


def _spec(t: Any) -> str:
    sharding = t._sharding
    if sharding is None:
        return "{replicated}"
    try:
        return sharding.spec_string()
    except NotImplementedError as exc:  # a sharding the simulator does not derive
        return str(exc)
