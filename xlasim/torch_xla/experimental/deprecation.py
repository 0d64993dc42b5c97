"""``torch_xla.experimental.deprecation``: wrap a function under an old name that logs one
warning (through the root ``logging`` logger) the first time it is called, then forwards."""

from __future__ import annotations

import functools
import importlib
import logging
from types import ModuleType
from typing import Any, TypeVar

FN = TypeVar("FN")


def deprecated(
    module: ModuleType, new: FN, old_name: str | None = None, extra_msg: str | None = None
) -> FN:
    target: Any = new
    name = old_name or target.__name__
    warned = False

    @functools.wraps(target)
    def forward(*args: Any, **kwargs: Any) -> Any:
        nonlocal warned
        if not warned:
            # torch_xla 2.9's text, once per wrapper.
            message = (
                f"{module.__name__}.{name} is deprecated. "
                f"Use {target.__module__}.{target.__name__} instead."
            )
            logging.warning(f"{message} {extra_msg}" if extra_msg else message)
            warned = True
        return target(*args, **kwargs)

    return forward  # type: ignore[return-value]


def mark_deprecated(new: FN, extra_msg: str | None = None) -> Any:
    """Decorator: the decorated function's name becomes a deprecated alias of ``new``. As in
    torch_xla 2.9, ``extra_msg`` does not reach the warning."""

    def decorate(func: Any) -> Any:
        return deprecated(importlib.import_module(func.__module__), new, old_name=func.__name__)

    return decorate


def register_deprecated(module: ModuleType, new: FN) -> None:
    # torch_xla 2.9's body names an ``extra_msg`` it never defines, so every call fails so.
    raise NameError("name 'extra_msg' is not defined")
