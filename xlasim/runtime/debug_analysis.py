"""torch_xla's PT_XLA_DEBUG analysis: why each graph was compiled and executed, written as
torch_xla 2.9 writes it.

The switches are torch_xla's: ``PT_XLA_DEBUG`` (on: level 100 unless ``PT_XLA_DEBUG_LEVEL``
says otherwise), ``PT_XLA_DEBUG_LEVEL`` (1: compilations only; above 1: executions too),
``PT_XLA_DEBUG_FILE`` (appended to; stderr without it) and ``PT_XLA_DEBUG_MAX_FRAME`` (8).
Only the process of local rank 0 writes, and nothing is written for eager mode's graphs.

Each compiled graph gets a "Compilation Analysis" block, then the compiled program's hash and
a "Post Compilation Analysis" of its sizes; each execution (level above 1) an "Execution
Analysis" block. A block names the cause, which torch_xla reads off the Python stack -- the
frames from where the program entered torch_xla's C++, innermost first (here: from where it
entered the simulator's runtime):

- a ``sync`` in ``torch_xla.py`` (or any ``mark_step``): the first enclosing frame that is
  the parallel loader's ``next``, a profiler's ``__exit__`` (a ``StepTrace`` ending), the
  dynamo bridge's ``extract_compiled_graph_helper``/``extract_internal``, or
  ``torch_xla.compile``'s ``_compile``/``_clear_pending_ops_before_compile``; else the user's;
- the dynamo bridge's ``extract_graph_helper``: dynamo compiling an FX graph;
- otherwise: most likely user code reading a value;
- a program dynamo compiled, executed: said so whatever the stack.

Graph hashes are the simulator's own (128-bit hex, as torch_xla prints its hashes), the same
for a graph's compilation and its executions. Inputs count the graph's distinct device data,
its distinct Python scalars other than 0 and +-1 (torch_xla uploads those as data), and the
random-number seed when the graph draws random numbers. The program sizes torch_xla reads from
the compiled executable are known here for the inputs and outputs; the others are written as
torch_xla writes a size it cannot read ("Unknown  GB").
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from xlasim.runtime.settings import xla_env_int

_RULE = "=" * 80
_DASHES = "-" * 80
COMPILATION = "Compilation Analysis: "
EXECUTION = "Execution Analysis: "
POST_COMPILATION = "Post Compilation Analysis: "

# Frames that stand for torch_xla's C++ (and torch's dispatch into the simulated tensors): the
# stack is read from the first frame outside them.
_XLASIM_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_INTERNAL = (
    os.path.join(_XLASIM_DIR, "runtime") + os.sep,
    os.path.join(_XLASIM_DIR, "sharding") + os.sep,
    os.path.join(_XLASIM_DIR, "torch_xla", "_XLAC.py"),
    os.path.join(os.path.dirname(torch.__file__), "_ops.py"),
    os.path.join(os.path.dirname(torch.__file__), "utils", "_python_dispatch.py"),
)

# Enclosing frames that name a sync's cause: (function, file name ending, cause).
_SYNC_CALLERS = (
    ("next", "parallel_loader.py", "torch_xla.sync in parallel loader at step end"),
    ("__exit__", "profiler.py", "torch_xla.sync when exiting a profiler StepTrace region"),
    (
        "extract_compiled_graph_helper",
        "dynamo_bridge.py",
        "torch_xla.sync when dynamo processing input graphs",
    ),
    ("extract_internal", "dynamo_bridge.py", "torch_xla.sync when dynamo processing input graphs"),
    ("_compile", "torch_xla.py", "torch_xla.compile"),
    (
        "_clear_pending_ops_before_compile",
        "torch_xla.py",
        "torch_xla.compile clear the pending graph prior calling the target function",
    ),
)


def _env_on(name: str) -> bool:
    """torch_xla's GetEnvBool: 'true', 'false', or a number (non-zero: on)."""
    raw = os.environ.get(name)
    if raw is None:
        return False
    if raw in ("true", "false"):
        return raw == "true"
    return xla_env_int(name, 0) != 0


def level() -> int:
    """The analysis level: PT_XLA_DEBUG_LEVEL, or 100 when only PT_XLA_DEBUG is on."""
    given = xla_env_int("PT_XLA_DEBUG_LEVEL", -1)
    if given == -1 and _env_on("PT_XLA_DEBUG"):
        return 100
    return given


def _writes() -> bool:
    return xla_env_int("PJRT_LOCAL_PROCESS_RANK", 0) == 0


def _emit(text: str) -> None:
    path = os.environ.get("PT_XLA_DEBUG_FILE", "")
    if not path:
        sys.stderr.write(text)
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)


def hash_text(key: Any) -> str:
    """A graph key as a 128-bit hash in hex, leading zeros dropped (torch_xla's format)."""
    digest = hashlib.md5(repr(key).encode(), usedforsecurity=False).digest()
    return format(int.from_bytes(digest, "big"), "x")


def python_frames() -> list[tuple[str, str, int]]:
    """(function, file, line) of the Python frames from where the program entered the
    simulator's runtime, innermost first."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL):
        frame = frame.f_back  # type: ignore[assignment]
    frames = []
    while frame is not None:
        code = frame.f_code
        frames.append((code.co_name, code.co_filename, frame.f_lineno))
        frame = frame.f_back  # type: ignore[assignment]
    return frames


def _cause(frames: list[tuple[str, str, int]], dynamo_execution: bool) -> str:
    if dynamo_execution:
        return "dynamo is executing a compiled program"
    function, file, _ = frames[0]
    if function == "mark_step" or (function == "sync" and file.endswith("torch_xla.py")):
        for outer, outer_file, _ in frames[1:]:
            for name, ending, cause in _SYNC_CALLERS:
                if outer == name and outer_file.endswith(ending):
                    return cause
        return "user torch_xla.sync"
    if function == "extract_graph_helper" and file.endswith("dynamo_bridge.py"):
        return "dynamo is compiling a FX graph to HLO"
    return "most likely user code trying to access tensor value before torch_xla.sync"


def graph_analysis(
    prefix: str,
    key: Any,
    num_inputs: int,
    num_outputs: int,
    graph_name: str,
    eager_mode: bool,
    dynamo_execution: bool = False,
) -> None:
    """Writes the Compilation (``prefix`` COMPILATION) or Execution Analysis of a graph."""
    debug_level = level()
    compilation = prefix == COMPILATION
    if eager_mode and not dynamo_execution:
        return
    if debug_level <= 0 or (debug_level <= 1 and not compilation) or not _writes():
        return
    frames = python_frames()
    if not frames:
        return
    lines = [_RULE, "Compilation Cause" if compilation else "Execution Cause"]
    lines.append("  " + _cause(frames, dynamo_execution))
    lines.append("Graph Info: ")
    if graph_name:
        lines.append(f"  Graph Name: {graph_name}")
    lines.append(f"  Graph Hash: {hash_text(key)}")
    lines.append(f"  Number of Graph Inputs: {num_inputs}")
    lines.append(f"  Number of Graph Outputs: {num_outputs}")
    lines.append("Python Frame Triggered Execution: ")
    remaining = xla_env_int("PT_XLA_DEBUG_MAX_FRAME", 8)
    for function, file, line in frames:
        remaining -= 1
        if remaining < 0:
            lines.append("  ..........")
            break
        lines.append(f"  {function} ({file}:{line})")
    lines += [_DASHES, _RULE]
    _emit("\n" + "".join(f"{prefix}{line}\n" for line in lines))


def _gigabytes(nbytes: int | None) -> str:
    # std::to_string of a double: six decimals
    return "Unknown " if nbytes is None else f"{nbytes / 1024 / 1024 / 1024:f}"


_SIZES = (
    "Graph input size",
    "Graph output size",
    "Aliased Input size",
    "Intermediate tensor size",
    "Compiled program size",
)


def post_compilation_analysis(key: Any, sizes: Sequence[int | None], eager_mode: bool) -> None:
    """Writes the compiled program's hash and its Post Compilation Analysis: ``sizes`` are the
    program's input, output, aliased input, intermediate and code bytes (None: unknown)."""
    if level() <= 0 or not _writes() or eager_mode:
        return
    named = zip(_SIZES, sizes, strict=True)
    lines = [_RULE] + [f"{name}: {_gigabytes(n)} GB" for name, n in named] + [_DASHES, _RULE]
    text = f"\nComputation hash: {hash_text(('computation', key))}\n\n"
    _emit(text + "".join(f"{POST_COMPILATION}{line}\n" for line in lines))


# Schema types whose argument torch_xla uploads as device data when given a Python number.
_SCALAR_TYPES = frozenset({"Tensor", "Optional[Tensor]", "number", "Optional[number]"})


def _scalars(node: Any, schema: Any) -> Iterable[Any]:
    """The Python numbers ``node``'s op took for tensor or scalar arguments."""
    args = node.args
    if type(args) is not tuple or not args or not isinstance(args[0], list):
        return
    consts = args[0]
    tensors = sum(1 for i in node.inputs if i is not None)
    at = 0
    for a in schema.arguments:
        if a.kwarg_only or at >= len(consts):
            return
        kind = str(a.type)
        if kind == "Tensor" and tensors:
            tensors -= 1  # a device tensor: not among the recorded non-tensor arguments
            continue
        value = consts[at]
        at += 1
        if kind in _SCALAR_TYPES and type(value) in (int, float):
            yield value


def count_inputs(outputs: Iterable[Any]) -> int:
    """A graph's parameters: its distinct device data, its distinct Python scalars other than
    0 and +-1, and the random-number seed when an op of it draws random numbers."""
    data: set[int] = set()
    scalars: set[float] = set()
    random = False
    seen: set[int] = set()
    stack = list(outputs)
    while stack:
        item = stack.pop()
        if isinstance(item, tuple):  # device data
            data.add(id(item))
            continue
        if id(item) in seen or not hasattr(item, "inputs"):
            continue
        seen.add(id(item))
        stack.extend(item.inputs)
        schema = getattr(item.op, "_schema", None)
        if schema is None:
            continue
        random = random or any(a.name == "generator" for a in schema.arguments)
        scalars.update(float(v) for v in _scalars(item, schema) if v not in (0, 1, -1))
    return len(data) + len(scalars) + (1 if random else 0)
