"""Dry runs: the user's program on shape-only values.

In a dry run every simulated device tensor wraps a ``meta`` tensor: ops, autograd, sharding,
graph hashing, compile accounting, per-chip memory and the TPU compiler need shapes only, so a
model of any size goes through them without allocating its values.

Real programs build their model on the CPU and move it with ``.to(device)``.  Building an
8B-parameter model on the CPU would itself allocate 32 GB, so while a dry run is active the
factory functions that only *size* a tensor (``torch.empty``, ``zeros``, ``ones``, ``full``,
``rand``, ``randn``, ``randint``, ``randperm``, ``normal``, ``empty_strided``) make ``meta``
tensors when they are asked for a CPU tensor: module constructors and their initialisers,
synthetic batches and optimizer state cost nothing.  Those CPU-side tensors report device
``meta``.  Tensors made from data the program holds (``torch.tensor``, ``as_tensor``,
``from_numpy``, ``arange``) keep their values; moved to a device they become shape-only too.

What needs a value (``.item()``, ``bool()`` of a tensor, printing one, ``.cpu()``, ops whose
output shape depends on values such as ``nonzero``) raises ``RuntimeError`` naming the user's
line.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from xlasim.runtime import state
from xlasim.runtime.graph import user_site

META = torch.device("meta")
_CPU = torch.device("cpu")

# Factory functions whose result is determined by a size alone (no data from the program).
_SIZED_FACTORIES = frozenset(
    {
        torch.empty,
        torch.empty_strided,
        torch.zeros,
        torch.ones,
        torch.full,
        torch.rand,
        torch.randn,
        torch.randint,
        torch.randperm,
        torch.normal,
    }
)


def _is_cpu(device: Any) -> bool:
    if device is None:
        return torch.get_default_device().type == "cpu"
    if isinstance(device, int):  # an int device is a CUDA-style ordinal, never the CPU
        return False
    return torch.device(device).type == "cpu"


class ShapeOnlyFactories(TorchFunctionMode):
    """Turns CPU calls of the size-only factory functions into ``meta`` tensors, while the
    active runtime is a dry run (not while the simulator's own scratch runtime is)."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if (
            func in _SIZED_FACTORIES
            and _dry_run_active()
            and _is_cpu(kwargs.get("device"))
            and _sized(func, args, kwargs)
        ):
            kwargs = {**kwargs, "device": META}
            kwargs.pop("pin_memory", None)
        return func(*args, **kwargs)


# Above zero while the simulator itself makes tensors that must be CPU tensors even in a dry run.
_suspended = 0


@contextlib.contextmanager
def cpu_factories() -> Iterator[None]:
    """Factories make CPU tensors again inside: the TPU compiler's replay traces on CPU fake
    tensors (one device for every value), whatever the program's factories make."""
    global _suspended
    _suspended += 1
    try:
        yield
    finally:
        _suspended -= 1


def _dry_run_active() -> bool:
    runtime = state.active()
    return runtime is not None and runtime.dry_run and not _suspended


def _sized(func: Any, args: Any, kwargs: Any) -> bool:
    # torch.normal(mean, std) with tensors follows its inputs; only its sized form (float
    # mean and std plus a size) is a factory.
    return func is not torch.normal or "size" in kwargs or len(args) > 2


def needs_values(what: str) -> RuntimeError:
    """The error for ``what`` (something that reads a tensor's values) in a dry run."""
    return RuntimeError(
        f"xlasim dry run: {what} needs tensor values, which a dry run does not compute "
        f"(at {user_site()}); run without --dry-run / XLASIM_DRY_RUN to get values"
    )


def cannot_compute(op: Any, error: BaseException) -> RuntimeError | None:
    """The error for ``op`` failing on shape-only values, or None when ``error`` is an
    ordinary error the op would raise on real values as well."""
    message = str(error)
    if not isinstance(error, NotImplementedError) and "meta" not in message:
        return None
    return needs_values(f"{op} (its result depends on the values of its inputs)")


def shape_only(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a shape-only (meta) tensor: what a dry run keeps of the data moved in."""
    return t if t.is_meta else t.to(META)
