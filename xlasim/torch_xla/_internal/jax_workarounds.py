"""``torch_xla._internal.jax_workarounds``: how torch_xla's JAX interop gets jax and torchax.

jax comes from the simulator's TPU-compiler layer (the optional ``tpu-compiler`` extra), set up
for the CPU; without it ``maybe_get_jax`` returns ``None`` as torch_xla does without jax.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import logging
import os
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import torch_xla

from xlasim.runtime import jax_interop

_SKIP_MEGASCALE = "SKIP_MEGASCALE_PJRT_CLIENT"


def jax_import_guard() -> None:
    # The runtime's client comes up before jax is imported (on a TPU, torch_xla must hold the
    # chips first).
    torch_xla._XLAC._init_computation_client()


@contextlib.contextmanager
def jax_env_context() -> Iterator[None]:
    """torch_xla sets ``SKIP_MEGASCALE_PJRT_CLIENT=true`` while JAX code runs."""
    before = os.environ.get(_SKIP_MEGASCALE)
    os.environ[_SKIP_MEGASCALE] = "true"
    try:
        yield
    finally:
        if before:
            os.environ[_SKIP_MEGASCALE] = before
        else:
            os.environ.pop(_SKIP_MEGASCALE, None)


def requires_jax(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` run after the import guard, inside ``jax_env_context``."""

    @functools.wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            jax_import_guard()
        except ImportError as e:
            raise ImportError("JAX import guard fail due to PJRT client is unavailable.") from e
        with jax_env_context():
            return func(*args, **kwargs)

    return guarded


def _has_jax() -> bool:
    return importlib.util.find_spec("jax") is not None


def maybe_get_jax(log: bool = True) -> ModuleType | None:
    if not _has_jax():
        if log:
            logging.warning(
                "You are trying to use a feature that requires jax/pallas."
                "You can install Jax/Pallas via pip install torch_xla[pallas]"
            )
        return None
    jax_import_guard()
    with jax_env_context():
        jax: ModuleType = jax_interop.layer().jax_module()
        # torch_xla's shardings are GSPMD's.
        jax.config.update("jax_use_shardy_partitioner", False)
        return jax


def maybe_get_torchax() -> ModuleType | None:
    if not _has_jax():
        return None
    try:
        jax_import_guard()
        with jax_env_context():
            # jax first, set up as the simulator's layer runs it.
            jax_interop.layer()
            torchax = importlib.import_module("torchax")
            for sub in ("tensor", "interop", "ops.mappings"):
                importlib.import_module(f"torchax.{sub}")
            return torchax
    except ImportError:
        return None
