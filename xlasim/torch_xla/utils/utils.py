"""The helpers of ``torch_xla.utils.utils`` that the runtime modules and user code use."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any


def getenv_as(name: str, type: Callable[[str], Any], defval: Any = None) -> Any:  # noqa: A002
    env = os.environ.get(name, None)
    if type is bool:
        return defval if env is None else bool(int(env))
    return defval if env is None else type(env)


def check_env_flag(name: str, default: str = "") -> bool:
    flag = os.getenv(name, default)
    return flag == "true" or (flag.isdigit() and int(flag) > 0)


def get_print_fn(debug_env: str = "XLA_DEBUG_PRINT") -> Callable[..., None]:
    return print if check_env_flag(debug_env) else (lambda *a, **k: None)
