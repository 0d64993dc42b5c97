"""How a simulation runs beyond the simulated device itself: which real compiler also compiles
every graph, and whether values are computed at all (a dry run).

Each option comes from its ``simulate(...)`` argument, else from the environment
(``XLASIM_COMPILER``, ``XLASIM_DRY_RUN``: what ``xlasim run --compiler/--dry-run`` and the
pytest option set).  Both are checked when a simulation is created, before torch is loaded,
so a bad value fails at once with the valid ones named.  Standard library only.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping

COMPILER_ENV = "XLASIM_COMPILER"
DRY_RUN_ENV = "XLASIM_DRY_RUN"
# Set by `xlasim run`: the program prints compile progress and, at exit, the compiled-graph
# table (a library user asks for them with xlasim.compiled_graphs_report()).
REPORT_ENV = "XLASIM_COMPILER_REPORT"

LIBTPU = "libtpu"
COMPILERS = (LIBTPU,)
EXTRA = "tpu-compiler"
INSTALL = f"pip install 'xlasim[{EXTRA}]'"
# What the extra brings; both must be importable for the libtpu compiler.
_EXTRA_MODULES = ("jax", "libtpu")

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def resolve_compiler(value: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """The compiler to run (``None``: the simulator's own accounting only).

    ``value`` ``None`` means "not given": ``XLASIM_COMPILER`` decides.  ``'none'`` or ``''``
    turn the compiler off.  Raises ``ValueError`` for an unknown name and
    ``ModuleNotFoundError`` when the compiler's extra is not installed.
    """
    source = ""
    if value is None:
        value, source = environ.get(COMPILER_ENV, ""), f" (from {COMPILER_ENV})"
    if not isinstance(value, str):
        raise TypeError(f"compiler must be a str or None, got {type(value).__name__} {value!r}")
    name = value.strip().lower()
    if name in ("", "none"):
        return None
    if name not in COMPILERS:
        raise ValueError(f"unknown compiler {value!r}{source}; valid: {', '.join(COMPILERS)}, none")
    for module in _EXTRA_MODULES:
        if importlib.util.find_spec(module) is None:
            raise ModuleNotFoundError(
                f"compiler {name!r} needs the {EXTRA} extra (jax[tpu] and libtpu), and "
                f"module {module!r} is not installed: {INSTALL}",
                name=module,
            )
    return name


def resolve_dry_run(value: bool | None, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the simulation runs on shapes only (``None``: ``XLASIM_DRY_RUN`` decides)."""
    if value is not None:
        if not isinstance(value, bool):
            raise TypeError(f"dry_run must be a bool or None, got {type(value).__name__} {value!r}")
        return value
    raw = environ.get(DRY_RUN_ENV, "")
    flag = raw.strip().lower()
    if flag in _TRUE:
        return True
    if flag in _FALSE:
        return False
    raise ValueError(
        f"{DRY_RUN_ENV}={raw!r} is not a valid flag; valid: {', '.join(_TRUE)} or "
        f"{', '.join(repr(f) for f in _FALSE)}"
    )
