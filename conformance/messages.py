"""Matching torch_xla's error messages on every target.

The simulator raises torch_xla 2.9's own text unchanged; where it can say more (which choices
are valid), it appends one parenthesis that always starts ``(xlasim: ``. A conformance test
checks the exact torch_xla text and allows only that addition.
"""

from __future__ import annotations

import re


def torch_xla_message(message: str) -> str:
    """A ``pytest.raises(match=...)`` pattern: exactly ``message``, or it plus xlasim's hint."""
    return f"(?s)^{re.escape(message)}( \\(xlasim: .*\\))?$"
