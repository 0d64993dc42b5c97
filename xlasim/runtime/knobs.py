"""The simulator's own environment variables (``XLASIM_*``), parsed one way.

A variable that is unset or empty takes its default; any other value must be valid, and a
value that is not raises :class:`EnvError` naming the variable, the value and what would be
valid -- a typo never silently switches a knob off.  (The ``XLA_*`` variables torch_xla itself
reads keep torch_xla's own parsing, in the surface.)  Imports nothing heavy: interpreter
start-up reads these.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

__all__ = [
    "ENFORCE_HBM_ENV",
    "HOSTS_TIMEOUT_ENV",
    "MAT_MUL_PRECISION_ENV",
    "NUMERICS",
    "NUMERICS_ENV",
    "PRECISIONS",
    "EnvError",
    "check_runtime_knobs",
    "env_bool",
    "env_choice",
    "env_float",
    "env_int",
    "TRUE_WORDS",
    "FALSE_WORDS",
]

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
