"""Every environment variable the simulator reads, parsed in one place.

- The simulator's own knobs (``XLASIM_*``): a variable that is unset or empty takes its
  default; any other value must be valid, and one that is not raises :class:`EnvError` naming
  the variable, the value and what would be valid -- a typo never silently switches a knob off.
- How a simulation runs beyond the device itself: which real compiler also compiles every
  graph (``XLASIM_COMPILER``) and whether values are computed at all (``XLASIM_DRY_RUN``), what
  ``simulate(...)``'s arguments, ``xlasim run --compiler/--dry-run`` and the pytest options set.
  Checked when a simulation is created, before torch is loaded.
- torch_xla's own ``XLA_*`` variables, read the way its C++ reads them (``sys_util``): lenient,
  as real torch_xla is, so a program behaves the same on both.

Standard library only: interpreter start-up reads these.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
from collections.abc import Mapping
from types import ModuleType

# -- the simulator's own knobs (XLASIM_*) ---------------------------------------------------


TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


# Read by the runtime (hbm, hosts) at first use, checked by simulate() at entry.
ENFORCE_HBM_ENV = "XLASIM_ENFORCE_HBM"
HOSTS_TIMEOUT_ENV = "XLASIM_HOSTS_TIMEOUT_S"
# Read when a simulation starts: ``tpu`` computes matmul-class ops as the TPU's matrix unit
# does (xlasim.runtime.numerics); ``exact`` keeps the CPU kernels' float32 -- not what a TPU
# computes, for comparing with eager CPU bit for bit.
NUMERICS_ENV = "XLASIM_NUMERICS"
NUMERICS = ("tpu", "exact")
# The mat-mul precision a simulated process starts at (torch_xla's levels; its own start is
# 'default'): for harnesses whose processes -- workers, hosts, spawned children -- should all
# run as if they had called torch_xla.backends.set_mat_mul_precision first.
MAT_MUL_PRECISION_ENV = "XLASIM_MAT_MUL_PRECISION"
PRECISIONS = ("default", "high", "highest")


class EnvError(ValueError):
    """An ``XLASIM_*`` variable holds a value the simulator cannot use."""


def _raw(name: str, environ: Mapping[str, str] | None) -> str | None:
    value = (os.environ if environ is None else environ).get(name)
    if value is None or not value.strip():
        return None
    return value.strip()


def env_bool(name: str, default: bool = False, environ: Mapping[str, str] | None = None) -> bool:
    """``name`` as an on/off switch: 1/true/yes/on or 0/false/no/off, any case."""
    raw = _raw(name, environ)
    if raw is None:
        return default
    word = raw.lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise EnvError(
        f"{name}={raw!r} is not a valid on/off value: use one of {', '.join(TRUE_WORDS)} "
        f"(on) or {', '.join(FALSE_WORDS)} (off), or leave it unset"
    )


def env_int(
    name: str,
    default: int,
    *,
    minimum: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> int:
    """``name`` as a whole number (at least ``minimum`` when given)."""
    raw = _raw(name, environ)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or (minimum is not None and value < minimum):
        bound = f" >= {minimum}" if minimum is not None else ""
        raise EnvError(f"{name}={raw!r} is not valid: expected a whole number{bound}")
    return value


def env_choice(
    name: str, choices: tuple[str, ...], default: str, environ: Mapping[str, str] | None = None
) -> str:
    """``name`` as one of ``choices`` (any case)."""
    raw = _raw(name, environ)
    if raw is None:
        return default
    if raw.lower() in choices:
        return raw.lower()
    raise EnvError(
        f"{name}={raw!r} is not valid: use one of {', '.join(choices)}, or leave it unset"
    )


def env_float(
    name: str, default: float, *, positive: bool = True, environ: Mapping[str, str] | None = None
) -> float:
    """``name`` as a finite number of (by default positive) seconds, bytes...."""
    raw = _raw(name, environ)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or (positive and value <= 0):
        kind = "a finite number > 0" if positive else "a finite number"
        raise EnvError(f"{name}={raw!r} is not valid: expected {kind}")
    return value


def check_runtime_knobs(environ: Mapping[str, str] | None = None) -> None:
    """Fails now on a bad value of a knob the runtime reads later, at first use."""
    env_bool(ENFORCE_HBM_ENV, environ=environ)
    env_float(HOSTS_TIMEOUT_ENV, 1.0, environ=environ)
    env_choice(NUMERICS_ENV, NUMERICS, NUMERICS[0], environ=environ)
    env_choice(MAT_MUL_PRECISION_ENV, PRECISIONS, PRECISIONS[0], environ=environ)


# -- the real compiler and dry runs ---------------------------------------------------------

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


def tpu_compiler_layer(module: str, purpose: str) -> ModuleType:
    """``module`` of the TPU-compiler layer, imported on first use (it imports jax); without
    jax, ``NotImplementedError`` saying ``purpose`` needs the extra."""
    if importlib.util.find_spec("jax") is None:
        raise NotImplementedError(
            f"{purpose}, which needs the {EXTRA} extra (jax is not installed): {INSTALL}"
        )
    return importlib.import_module(module)


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
    if flag in TRUE_WORDS:
        return True
    if not flag or flag in FALSE_WORDS:
        return False
    raise ValueError(
        f"{DRY_RUN_ENV}={raw!r} is not a valid flag; valid: {', '.join(TRUE_WORDS)} or "
        f"{', '.join(repr(f) for f in ('', *FALSE_WORDS))}"
    )


# -- torch_xla's own variables, as its C++ reads them ---------------------------------------


def xla_env_int(name: str, default: int, environ: Mapping[str, str] = os.environ) -> int:
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


def xla_env_flag(name: str, default: str = "") -> bool:
    """How torch_xla reads its on/off environment variables: a positive integer, or 'true'."""
    value = os.environ.get(name, default)
    if value.isdigit():
        return int(value) > 0
    return value == "true"
