"""Recompilation reports: why a program compiled a new graph where it had compiled one before.

On a TPU every new graph shape costs a full XLA compile (seconds to minutes), and the most
common cause of a slow TPU job is a graph that keeps changing: a ragged last batch, a dtype
that flips, a Python int baked into the graph.  The simulator keys graphs the way torch_xla
does, so it sees each of these in a CPU test and can say which input changed and which line
of the user's code cut the graph::

    import xlasim
    with xlasim.assert_no_recompilation():
        for x, y in loader:
            train_step(x, y)

    print(xlasim.recompilation_report())

A *recompilation* is an ``UncachedCompile`` of a graph cut at a source line that had already
compiled a different graph; the first compile at each line is a warm-up, not a
recompilation.  Everything here reads the active simulated runtime (``RuntimeError`` when
no simulation is active).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass

from xlasim.runtime import state
from xlasim.runtime.graph import GraphRecord, InputInfo, Recompilation

__all__ = [
    "InputChange",
    "RecompilationError",
    "RecompilationReport",
    "RecompilationWatch",
    "assert_no_recompilation",
    "clear_recompilations",
    "recompilation_report",
    "recompilations",
]

_SITE = re.compile(r"^(?P<file>.*):(?P<line>\d+) in (?P<function>.*)$")


@dataclass(frozen=True)
class InputChange:
    """One device-data input of the graph that differs from the previous compile."""

    index: int
    """Position among the graph's device-data inputs (torch_xla's parameter number)."""
    before: InputInfo | None
    """None when the input is new (the graph has more inputs than before)."""
    after: InputInfo | None
    """None when the input is gone."""

    @property
    def fields(self) -> tuple[str, ...]:
        """Which of 'shape', 'dtype', 'sharding' changed ('added'/'removed' for new/gone)."""
        if self.before is None:
            return ("added",)
        if self.after is None:
            return ("removed",)
        return tuple(
            name
            for name in ("shape", "dtype", "sharding")
            if getattr(self.before, name) != getattr(self.after, name)
        )

    def describe(self) -> str:
        if self.before is None:
            assert self.after is not None
            return f"input {self.index} is new: {self.after.describe()}"
        if self.after is None:
            return f"input {self.index} is gone (was {self.before.describe()})"
        parts = []
        for name in self.fields:
            old, new = getattr(self.before, name), getattr(self.after, name)
            if name == "shape":
                parts.append(f"shape {list(old)} -> {list(new)}")
            elif name == "dtype":
                parts.append(
                    f"dtype {str(old).replace('torch.', '')} -> {str(new).replace('torch.', '')}"
                )
            else:
                parts.append(f"sharding {old or 'none'!s} -> {new or 'none'!s}")
        return f"input {self.index} ({self.after.describe()}): " + ", ".join(parts)


@dataclass(frozen=True)
class RecompilationReport:
    """Why one graph was compiled again at the same place in the user's code."""

    site: str
    """``file:line in function`` of the user's code that cut the graph."""
    filename: str
    lineno: int
    function: str
    changed_inputs: tuple[InputChange, ...]
    """Inputs whose shape, dtype or sharding differ, in input order."""
    ops_added: tuple[str, ...]
    ops_removed: tuple[str, ...]
    ops_changed: bool
    """True when the traced ops differ at all (also when only their order/count does)."""
    num_outputs: tuple[int, int]
    """(before, after) number of graph outputs (live tensors the sync materialized)."""
    previous: GraphRecord
    current: GraphRecord

    @property
    def location(self) -> str:
        """``file:line``."""
        return f"{self.filename}:{self.lineno}"

    @property
    def reasons(self) -> tuple[str, ...]:
        """Human-readable causes, most specific first."""
        # A tensor used by several ops shows up once per use; say it once.
        grouped: dict[tuple[InputInfo | None, InputInfo | None], list[InputChange]] = {}
        for c in self.changed_inputs:
            grouped.setdefault((c.before, c.after), []).append(c)
        out = []
        for group in grouped.values():
            text = group[0].describe()
            if len(group) > 1:
                indices = ", ".join(str(c.index) for c in group)
                text = f"inputs {indices}" + text[len(f"input {group[0].index}") :]
            out.append(text)
        if self.ops_added or self.ops_removed:
            out.append(
                f"traced ops changed: added {list(self.ops_added) or 'none'}, "
                f"removed {list(self.ops_removed) or 'none'}"
            )
        elif self.ops_changed and not self.changed_inputs:
            out.append("the same ops were traced in a different order or number")
        if self.num_outputs[0] != self.num_outputs[1]:
            out.append(
                f"the graph materializes {self.num_outputs[1]} tensors instead of "
                f"{self.num_outputs[0]} (a different set of live tensors at the sync)"
            )
        if not out:
            out.append("the graph hash differs (a Python scalar baked into the graph?)")
        return tuple(out)

    def describe(self) -> str:
        lines = [f"graph recompiled at {self.site}"]
        lines += [f"  - {r}" for r in self.reasons]
        return "\n".join(lines)


def _report(rec: Recompilation) -> RecompilationReport:
    match = _SITE.match(rec.site)
    filename, lineno, function = (
        (match["file"], int(match["line"]), match["function"]) if match else (rec.site, 0, "?")
    )
    prev, cur = rec.previous, rec.current
    changes = [
        InputChange(i, old, new)
        for i, (old, new) in enumerate(zip(prev.inputs, cur.inputs, strict=False))
        if old != new
    ]
    n_prev, n_cur = len(prev.inputs), len(cur.inputs)
    changes += [InputChange(i, prev.inputs[i], None) for i in range(n_cur, n_prev)]
    changes += [InputChange(i, None, cur.inputs[i]) for i in range(n_prev, n_cur)]
    old_ops, new_ops = set(prev.ops), set(cur.ops)
    return RecompilationReport(
        site=rec.site,
        filename=filename,
        lineno=lineno,
        function=function,
        changed_inputs=tuple(changes),
        ops_added=tuple(sorted(new_ops - old_ops)),
        ops_removed=tuple(sorted(old_ops - new_ops)),
        ops_changed=prev.ops != cur.ops,
        num_outputs=(prev.num_outputs, cur.num_outputs),
        previous=prev,
        current=cur,
    )


def recompilations() -> list[RecompilationReport]:
    """Every recompilation of the active simulated runtime so far, oldest first."""
    return [_report(r) for r in state.current().graphs.recompilations]


def clear_recompilations() -> None:
    """Forget the recompilations seen so far (the compiled graphs stay cached)."""
    state.current().graphs.recompilations.clear()


def _format(reports: list[RecompilationReport], compiles: int | None) -> str:
    if not reports:
        head = "no recompilations"
        return head + (f" ({compiles} graph(s) compiled)" if compiles is not None else "")
    sites: dict[str, int] = {}
    for r in reports:
        sites[r.site] = sites.get(r.site, 0) + 1
    lines = [
        f"{len(reports)} recompilation(s) at {len(sites)} site(s)"
        + (f", {compiles} graph(s) compiled in all" if compiles is not None else "")
        + ":"
    ]
    for i, r in enumerate(reports, 1):
        lines.append(f"[{i}] {r.describe()}")
    return "\n".join(lines)


def recompilation_report() -> str:
    """A readable account of every recompilation so far (``'no recompilations ...'`` if none)."""
    rt = state.current()
    compiles = (rt.metrics.counter_value("UncachedCompile") or 0) + rt.graphs.backend_compiles
    return _format(recompilations(), compiles)


class RecompilationError(AssertionError):
    """Raised by :func:`assert_no_recompilation` when the block recompiled a graph."""

    def __init__(self, reports: list[RecompilationReport], allowed: int) -> None:
        self.reports = reports
        limit = "no recompilation" if allowed == 0 else f"at most {allowed} recompilation(s)"
        super().__init__(f"expected {limit}, got {len(reports)}:\n" + _format(reports, None))


class RecompilationWatch:
    """What a :func:`assert_no_recompilation` block saw (read it inside or after the block)."""

    def __init__(self, start: int) -> None:
        self._start = start

    @property
    def reports(self) -> list[RecompilationReport]:
        return [_report(r) for r in state.current().graphs.recompilations[self._start :]]


@contextlib.contextmanager
def assert_no_recompilation(allowed: int = 0) -> Iterator[RecompilationWatch]:
    """Fail (``RecompilationError``, an ``AssertionError``) if the block recompiles a graph.

    First compiles at a new source line are warm-up and allowed; pass ``allowed`` to tolerate
    a known number of recompilations.  An exception raised by the block itself propagates
    unchanged.
    """
    if isinstance(allowed, bool) or not isinstance(allowed, int) or allowed < 0:
        raise ValueError(f"allowed {allowed!r} is not valid: expected an int >= 0")
    graphs = state.current().graphs
    watch = RecompilationWatch(len(graphs.recompilations))
    yield watch
    reports = watch.reports
    if len(reports) > allowed:
        raise RecompilationError(reports, allowed)
