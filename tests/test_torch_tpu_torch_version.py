"""On a torch older than TorchTPU 0.2.0 supports, ``import torch_tpu`` in a simulation fails as
the real package cannot be installed there: an ImportError naming both versions (the wheel's
metadata: ``Requires-Dist: torch>=2.11.0,<=2.15.0``)."""

from __future__ import annotations

import pytest
import torch

import xlasim


@pytest.mark.skipif(
    torch.__version__ >= "2.11", reason=f"torch {torch.__version__} can load TorchTPU"
)
def test_torch_tpu_refuses_a_torch_older_than_2_11():
    with xlasim.simulate("2x2"), pytest.raises(ImportError) as info:
        import torch_tpu  # noqa: F401
    assert str(info.value) == (
        "torch_tpu 0.2.0 needs torch >= 2.11.0 (its wheel requires torch>=2.11.0,<=2.15.0); "
        f"this process has torch {torch.__version__}"
    )
