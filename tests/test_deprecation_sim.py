"""``torch_xla.experimental.deprecation``. The warning texts are real torch_xla 2.9's, read on
PJRT CPU; so is ``register_deprecated``'s NameError (its body names an undefined variable)."""

from __future__ import annotations

import logging
import sys

import pytest


def _new():
    return 5


def test_the_alias_warns_once_then_forwards(xlasim_sim, caplog):
    from torch_xla.experimental.deprecation import deprecated

    old = deprecated(sys.modules[__name__], _new, "old_name", "Gone in 3.0.")
    with caplog.at_level(logging.WARNING):
        assert (old(), old()) == (5, 5)
    assert [r.getMessage() for r in caplog.records] == [
        f"{__name__}.old_name is deprecated. Use {__name__}._new instead. Gone in 3.0."
    ]
    assert old.__name__ == "_new"  # functools.wraps of the new function


def test_mark_deprecated_names_the_decorated_function_and_drops_extra_msg(xlasim_sim, caplog):
    from torch_xla.experimental.deprecation import mark_deprecated

    @mark_deprecated(_new, extra_msg="not shown")
    def old_api():
        return 0

    with caplog.at_level(logging.WARNING):
        assert old_api() == 5
    assert [r.getMessage() for r in caplog.records] == [
        f"{__name__}.old_api is deprecated. Use {__name__}._new instead."
    ]


def test_register_deprecated_fails_as_in_torch_xla(xlasim_sim):
    from torch_xla.experimental.deprecation import register_deprecated

    with pytest.raises(NameError, match="name 'extra_msg' is not defined"):
        register_deprecated(sys.modules[__name__], _new)
