"""Environment variables read the way torch_xla's C++ reads them (``sys_util``)."""

from __future__ import annotations

import os
from collections.abc import Mapping


def env_int(name: str, default: int, environ: Mapping[str, str] = os.environ) -> int:
    """``sys_util::GetEnvInt``: unset -> default, else ``std::atoi`` (no digits -> 0)."""
    raw = environ.get(name)
    if raw is None:
        return default
    digits = raw.strip()
    sign = -1 if digits.startswith("-") else 1
    digits = digits.lstrip("+-")
    end = 0
    while end < len(digits) and digits[end].isdigit():
        end += 1
    return sign * int(digits[:end]) if end else 0


def env_flag(name: str, default: str = "") -> bool:
    """How torch_xla reads its on/off environment variables: a positive integer, or 'true'."""
    value = os.environ.get(name, default)
    if value.isdigit():
        return int(value) > 0
    return value == "true"
