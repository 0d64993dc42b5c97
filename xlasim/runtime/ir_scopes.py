"""The IR scope names profiler traces push (torch's lazy-tensor scope context).

Each thread keeps a stack of ``<name>.<n>`` entries, where ``n`` numbers the scopes opened one
after another at the same nesting level (from 1; a scope's own children count from 1 again).
A step barrier that resets scopes requires the stack to be empty, and restarts the numbering.
"""

from __future__ import annotations

import threading


class _Context(threading.local):
    def __init__(self) -> None:
        self.scopes: list[tuple[str, int]] = []  # (name.n, the numbering to resume after it)
        self.next_id = 1


_context = _Context()


def push(name: str) -> None:
    c = _context
    c.scopes.append((f"{name}.{c.next_id}", c.next_id + 1))
    c.next_id = 1


def pop() -> None:
    c = _context
    if not c.scopes:
        raise RuntimeError("xlasim: IR scope popped with none open")
    c.next_id = c.scopes.pop()[1]


def current() -> str:
    return "/".join(name for name, _ in _context.scopes)


def reset() -> None:
    """What a step barrier does: fails if a scope is still open, else restarts the numbering."""
    if _context.scopes:
        raise RuntimeError(f"Expecting scope to be empty but it is {current()}")
    _context.next_id = 1
