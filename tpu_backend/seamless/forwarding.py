"""Attributes that one object shows on behalf of another it holds."""

from __future__ import annotations

from typing import Any


class Forwarded:
    """``obj.<name>`` is ``getattr(obj, target).<name>``; assigning to it assigns there too
    when ``writable``, and raises ``AttributeError`` otherwise (as a read-only property)."""

    def __init__(self, target: str, *, writable: bool = False) -> None:
        self.target = target
        self.writable = writable

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else getattr(getattr(obj, self.target), self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        if not self.writable:
            raise AttributeError(f"property {self.name!r} of {type(obj).__name__!r} is read-only")
        setattr(getattr(obj, self.target), self.name, value)
