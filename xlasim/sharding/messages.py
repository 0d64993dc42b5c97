"""How xlasim adds to an error torch_xla itself raises.

The message starts with real torch_xla's text, unchanged, so code and tests matching it keep
working; what only the simulator can say (the valid choices, which argument) follows in one
parenthesis that always reads ``(xlasim: ...)``.
"""

from __future__ import annotations

HINT_PREFIX = " (xlasim: "


def with_hint(message: str, hint: str) -> str:
    """``message (xlasim: hint)``."""
    return f"{message}{HINT_PREFIX}{hint})"


def without_hint(message: str) -> str:
    """Real torch_xla's part of a message :func:`with_hint` made."""
    head, sep, _ = message.partition(HINT_PREFIX)
    return head if sep else message
