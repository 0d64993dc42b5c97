"""Simulated ``torch_xla.utils.buffer_donor_context``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch_xla


@contextmanager
def alias_with_buffer_donor_config(should_alias: bool = True) -> Iterator[bool]:
    """Sets torch_xla's buffer-donor aliasing switch for the block; yields the setting it
    replaced, which is put back on leaving."""
    previous = torch_xla._XLAC._xla_get_enable_alias_with_buffer_donor_config()
    torch_xla._XLAC._xla_set_enable_alias_with_buffer_donor_config(should_alias)
    try:
        yield previous
    finally:
        torch_xla._XLAC._xla_set_enable_alias_with_buffer_donor_config(previous)
