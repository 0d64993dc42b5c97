"""``torch_xla.compile(f, max_different_graphs=N)``: torch_xla's dynamic-shape detector.

While a compiled function runs, every IR node it creates (but device data and constants) is
recorded as (hash, text); the function's distinct op sequences are its graphs. A sequence that
leaves every known graph (a new op, or the function ending where no known graph ends) makes a
new graph, and once the function has ``N`` graphs that raises torch_xla's RuntimeError, which
names what was traced and what the known graphs expected there.

The known graphs of a function form a compressed trie in torch_xla: a position inside a run of
ops that every graph through it shares expects that one next op ("Expected: ..."); a position
where graphs fork or one ends lists each next op ("Expected either of:", in the order the
branches were made). The state is per session (one per compiled function, keyed by its name and
id); ``N`` is process-wide, set by each ``torch_xla.compile`` call.

A node's text is torch_xla's ``[] aten::add, xla_shape=f32[10]{0}, dynamic_dims: ()``, less the
attributes torch_xla appends for ops that have some (``aten::sum``'s dimensions). Only nodes
of single-output ops are recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from xlasim.runtime.errors import xla_type

# Set while a session is active: the op path checks it before recording anything.
ACTIVE = False

_max_graphs = 1

Value = tuple[int, str]


@dataclass
class _Session:
    graphs: list[tuple[Value, ...]] = field(default_factory=list)


_sessions: dict[str, _Session] = {}
_current: _Session | None = None
# The ops recorded so far in the current session, and whether they left every known graph
# (a new graph is being traced, so nothing more is checked until it ends).
_trace: list[Value] = []
_diverged = False


def set_max_different_graphs(n: int) -> None:
    global _max_graphs
    _max_graphs = int(n)


def max_different_graphs() -> int:
    return _max_graphs


def start_session(name: str) -> None:
    global _current, ACTIVE
    _current = _sessions.setdefault(name, _Session())
    ACTIVE = True
    _restart()


def remove_session(name: str) -> None:
    _sessions.pop(name, None)


def _restart() -> None:
    global _diverged
    _trace.clear()
    _diverged = False


def _active() -> _Session:
    if _current is None:
        raise RuntimeError("Check failed: IsSessionActive()")
    return _current


def _next_ops(graphs: list[tuple[Value, ...]], prefix: list[Value]) -> tuple[list[Value], bool]:
    """The ops that follow ``prefix`` in the known graphs (first-made branch first), and
    whether a known graph ends there."""
    n = len(prefix)
    following: dict[int, Value] = {}
    ends = False
    for g in graphs:
        if len(g) < n or list(g[:n]) != prefix:
            continue
        if len(g) == n:
            ends = True
        else:
            following.setdefault(g[n][0], g[n])
    return list(following.values()), ends


def _refuse(got: str, prefix: list[Value], graphs: list[tuple[Value, ...]]) -> RuntimeError:
    following, ends = _next_ops(graphs, prefix)
    lines = [f"Maximum number of different graphs allowed per function exceeded: {_max_graphs}"]
    lines.append(got)
    # Inside a run every graph through here shares (the root before any fork included).
    if len(following) == 1 and not ends:
        lines.append(f"Expected: {following[0][1]}")
    else:
        lines.append("Expected either of:")
        lines += [f"  - {value[1]}" for value in following]
    return RuntimeError("\n".join(lines) + "\n")


def record(node_hash: int, text: str) -> None:
    """An IR node created in the current session."""
    global _diverged
    session = _active()
    value = (node_hash, text)
    if not _diverged:
        following, _ = _next_ops(session.graphs, _trace)
        if session.graphs and all(v[0] != node_hash for v in following):
            if len(session.graphs) >= _max_graphs:
                error = _refuse(f"Got: {text}", _trace, session.graphs)
                _restart()  # torch_xla starts over from the root after the error
                raise error
            _diverged = True
    _trace.append(value)


def end_session() -> None:
    """The function returned: its sequence is a graph, new or known."""
    global _current, ACTIVE
    session = _active()
    try:
        new = bool(_trace) and tuple(_trace) not in session.graphs
        # a diverged trace was allowed its new graph when it left the known ones
        if new and not _diverged and session.graphs and len(session.graphs) >= _max_graphs:
            raise _refuse(
                f"Reached the end of the function at: {_trace[-1][1]}", _trace, session.graphs
            )
        if new:
            session.graphs.append(tuple(_trace))
    finally:
        _current = None
        ACTIVE = False
        _restart()


def node_text(op: torch._ops.OpOverload, value: torch.Tensor) -> str:
    """torch_xla's text of an IR node: scope, op, XLA shape with its layout, dynamic dims."""
    # torch_xla traces an in-place op as its functional op (``add_`` as ``aten::add``)
    name = op._schema.name.removesuffix("_")
    dims = ",".join(map(str, value.shape))
    layout = "{" + ",".join(map(str, reversed(range(value.dim())))) + "}" if value.dim() else ""
    return f"[] {name}, xla_shape={xla_type(value.dtype)}[{dims}]{layout}, dynamic_dims: ()"
