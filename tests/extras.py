"""Optional extras the tests need: skipped with their reason where absent, except in the tox
env that exists to run them (``XLASIM_REQUIRE_TPU_COMPILER=1``), where absence fails."""

from __future__ import annotations

import importlib.util
import os

import pytest

REQUIRE_ENV = "XLASIM_REQUIRE_TPU_COMPILER"


def tpu_compiler_missing() -> str | None:
    """Why the ``tpu-compiler`` extra cannot be used here, or None."""
    for module in ("jax", "libtpu"):
        if importlib.util.find_spec(module) is None:
            return f"the tpu-compiler extra is not installed (no module {module!r})"
    return None


def need_tpu_compiler(*, module_level: bool = False) -> None:
    """Skips the caller (a test, or a whole module) unless the extra is installed."""
    reason = tpu_compiler_missing()
    if reason is None:
        return
    if os.environ.get(REQUIRE_ENV):
        pytest.fail(f"{REQUIRE_ENV} is set but {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=module_level)
