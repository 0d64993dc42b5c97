"""The conformance suite compares every target with eager CPU, so its float32 matmuls run at
torch_xla's 'highest' precision on every target, as pytorch/xla's own TPU tests set it: at the
TPU's default precision (bfloat16 operands) no device result would match the CPU's within
float32 tolerances. A test that checks another level carries its own mark."""

from pathlib import Path

import pytest

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # pytest hands every collected item to this hook, not only this directory's.
    for item in items:
        if _HERE not in item.path.parents:
            continue
        if item.get_closest_marker("mat_mul_precision") is None:
            item.add_marker(pytest.mark.mat_mul_precision("highest"))
