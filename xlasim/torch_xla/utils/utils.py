"""The helpers of ``torch_xla.utils.utils`` that the runtime modules and user code use."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from xlasim.runtime import state as _runtime


def getenv_as(name: str, type: Callable[[str], Any], defval: Any = None) -> Any:  # noqa: A002
    """``name`` from the environment converted by ``type`` (a bool is read as an integer
    first, so '0' is False), or ``defval`` when it is not set."""
    raw = os.environ.get(name)
    if raw is None:
        return defval
    return bool(int(raw)) if type is bool else type(raw)


def check_env_flag(name: str, default: str = "") -> bool:
    return _runtime.env_flag(name, default)


def null_print(*args: Any, **kwargs: Any) -> None:
    """A ``print`` that prints nothing."""


def eprint(*args: Any, **kwargs: Any) -> None:
    """``print`` to standard error."""
    print(*args, file=sys.stderr, **kwargs)


def get_print_fn(debug: Any = None) -> Callable[..., None]:
    """``eprint`` when debugging (``debug``, else the DEBUG environment variable), else
    ``null_print``."""
    enabled = int(os.environ.get("DEBUG", "0")) if debug is None else debug
    return eprint if enabled else null_print
