"""Matching torch_xla's error messages on every target.

The simulator raises torch_xla 2.9's own text, exactly: ``str(e)`` and ``e.args`` are what real
torch_xla gives, so programs comparing messages behave the same. What only the simulator can
say (which choices are valid, which argument) is one exception note (``e.__notes__``) starting
with ``xlasim: ``, printed under the traceback; real torch_xla's errors carry no such note.

``pytest.raises(match=...)`` cannot check a message exactly here: pytest matches the message
and the notes joined by newlines, so :func:`raises_torch_xla` compares ``str(e)`` itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import pytest

NOTE_PREFIX = "xlasim: "

_E = TypeVar("_E", bound=BaseException)


@contextmanager
def raises_torch_xla(kind: type[_E], message: str) -> Iterator[pytest.ExceptionInfo[_E]]:
    """``pytest.raises(kind)`` whose exception's ``str()`` must be exactly ``message``."""
    with pytest.raises(kind) as info:
        yield info
    assert str(info.value) == message, f"torch_xla says {message!r}, got {str(info.value)!r}"


def xlasim_notes(error: BaseException) -> list[str]:
    """The notes the simulator added to ``error`` (none on a real target)."""
    return [n for n in getattr(error, "__notes__", ()) if n.startswith(NOTE_PREFIX)]


def check_hint(error: BaseException, xla_target: Any, *fragments: str) -> None:
    """On the simulator ``error`` has one xlasim note holding every fragment; elsewhere none."""
    notes = xlasim_notes(error)
    if xla_target.is_real:
        assert notes == [], notes
        return
    assert len(notes) == 1, notes
    missing = [f for f in fragments if f not in notes[0]]
    assert not missing, f"{missing} not in {notes[0]!r}"
