"""Simulated torch_xla (xlasim): imported as ``torch_xla`` inside a simulation."""

import importlib
from typing import Any

import torch  # noqa: F401 - real torch_xla imports torch first as well

# Real torch_xla's import loads torch.export (through torch_xla.stablehlo, lazy here), which
# registers torch.ops.quantized_decomposed; code quantizing weights for torch_xla calls it.
import torch.ao.quantization.fx._decomposed  # noqa: F401

from xlasim.runtime import dynamo_tensors

from . import (
    _XLAC,  # noqa: F401
    _patched_functions,
    experimental,  # noqa: E402,F401 - torch_xla.experimental.eager_mode() needs no import
    runtime,  # noqa: E402,F401
)
from ._internal import (
    custom_kernel,  # noqa: E402,F401 - the xla:: ops dynamo graphs call
    tpu,  # noqa: F401
)
from .core import xla_env_vars as xenv  # noqa: F401
from .core import xla_model  # noqa: E402,F401
from .distributed import xla_backend  # noqa: E402,F401 - registers the `xla` process group
from .torch_xla import (  # noqa: F401
    compile,
    device,
    device_count,
    devices,
    launch,
    manual_seed,
    real_devices,
    step,
    sync,
    xm,
    xmp,
    xr,
)
from .utils import utils as xu  # noqa: F401
from .version import __version__

# xm, xmp, xr, xu, xenv and tpu above: module aliases that real torch_xla's star import of its
# torch_xla.py leaves on the package, which code uses (``torch_xla.xm.fork_rng()``).

# torch.compile traces the simulated device tensors as torch_xla's own (and takes its settings).
dynamo_tensors.install()

# Importing torch_xla replaces torch's gradient clipping with its own.
_patched_functions._apply_patches()

# The simulated TPU host has libtpu; it is what picks PJRT_DEVICE=TPU when none is set.
_found_libtpu = True
runtime._maybe_select_default_device()

# torch_xla exports these from torch_xla.stablehlo, which imports torch.export (and with it
# dynamo): loaded on first use, so that importing torch_xla stays cheap.
_STABLEHLO_NAMES = ("save_as_stablehlo", "save_torch_model_as_stablehlo")


def __getattr__(name: str) -> Any:
    if name in _STABLEHLO_NAMES:
        return getattr(importlib.import_module("torch_xla.stablehlo"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "__version__",
    "compile",
    "device",
    "device_count",
    "devices",
    "launch",
    "manual_seed",
    "real_devices",
    "step",
    "sync",
]
