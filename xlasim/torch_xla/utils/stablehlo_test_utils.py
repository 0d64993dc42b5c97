"""``torch_xla.utils.stablehlo_test_utils``: helpers pytorch/xla's export tests use.

Comparing with a TensorFlow SavedModel is not simulated: the SavedModels come from
``torch_xla.tf_saved_model_integration``, which the simulator does not provide.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from typing import Any

import torch


@functools.cache
def has_tf_package() -> bool:
    """Whether TensorFlow is installed."""
    return importlib.util.find_spec("tensorflow") is not None


class _Wrapped(torch.nn.Module):
    def __init__(self, f: Callable[..., Any]) -> None:
        super().__init__()
        self._f = f

    def forward(self, *args: Any) -> Any:
        return self._f(*args)


def wrap_func_as_nn_module(f: Callable[..., Any]) -> torch.nn.Module:
    """``f`` as the forward of a module in eval mode (what ``torch.export.export`` takes)."""
    return _Wrapped(f).eval()


def _no_saved_models() -> NotImplementedError:
    return NotImplementedError(
        "xlasim: TensorFlow SavedModels of exported programs "
        "(torch_xla.tf_saved_model_integration) are not simulated"
    )


def load_save_model_and_inference(path: str, args: tuple[Any, ...]) -> dict[str, Any]:
    raise _no_saved_models()


def compare_exported_program_and_saved_model_result(
    ep: Any, saved_model_path: str, args: tuple[Any, ...], atol: float = 1e-7
) -> tuple[Any, Any]:
    raise _no_saved_models()
