"""How xlasim adds to an error torch_xla itself raises.

The exception carries real torch_xla's text unchanged, in ``str(e)`` and ``e.args``, so a
program that compares messages behaves as it does on real torch_xla. What only the simulator
can say (the valid choices, which argument) goes into one exception note (PEP 678) that
starts with ``xlasim: ``; Python prints it under the traceback.
"""

from __future__ import annotations

from typing import TypeVar

NOTE_PREFIX = "xlasim: "

_E = TypeVar("_E", bound=BaseException)


def torch_xla_error(kind: type[_E], message: str, hint: str) -> _E:
    """``kind(message)`` with torch_xla's ``message`` as it is and ``hint`` as a note."""
    error = kind(message)
    error.add_note(NOTE_PREFIX + hint)
    return error
