"""``torch_xla.experimental``'s eager-mode switches: in eager mode every op outside a
``torch_xla.compile``d function runs at once as its own graph."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch_xla._XLAC as _XLAC


def eager_mode(enable: bool) -> None:
    """Turns eager mode on or off for this process."""
    _XLAC._set_use_eager_mode(enable)


def is_eager_mode() -> bool:
    return _XLAC._get_use_eager_mode()


@contextlib.contextmanager
def eager_mode_context(enable: bool) -> Iterator[bool]:
    """Eager mode ``enable``d inside the block; yields whether it was on before."""
    before = is_eager_mode()
    eager_mode(enable)
    try:
        yield before
    finally:
        eager_mode(before)
