"""Simulated ``torch_xla.core.xla_op_registry``: PyTorch ops lowered by an xla_builder function.

Each distinct set of input shapes and keyword arguments builds its computation once; every call
runs it as one ``xla::_op_<name>`` IR node (``torch_xla._XLAC._xla_user_computation``).
"""

from __future__ import annotations

import pickle
import sys
import threading
from collections.abc import Callable
from typing import Any

import torch_xla
import torch_xla.core.xla_builder as xb
import torch_xla.utils.utils as xu


class Op:
    """A PyTorch op on XLA tensors whose lowering ``opfn`` builds with xla_builder ops."""

    def __init__(self, name: str, opfn: Callable[..., Any]) -> None:
        self._name = name
        self._opfn = opfn
        self._opname = "xla::_op_" + name
        self._lock = threading.Lock()
        self._computations: dict[bytes, Any] = {}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Runs the op on XLA tensors ``args``; ``kwargs`` (Python values, not tensors) go to
        the lowering function. One result is returned as is, several as a list."""
        shapes = xb.tensor_shape(args)
        key = pickle.dumps([shapes, kwargs])
        with self._lock:
            computation = self._computations.get(key)
            if computation is None:
                computation = xb.create_computation(self._name, self._opfn, shapes, **kwargs)
                self._computations[key] = computation
                if xu.getenv_as("XLA_OP_PRINT_COMPUTATIONS", bool, False):
                    print(xb.get_computation_hlo(computation), file=sys.stderr)
        outputs = torch_xla._XLAC._xla_user_computation(self._opname, args, computation)
        return outputs[0] if len(outputs) == 1 else outputs


def register(name: str, opfn: Callable[..., Any]) -> Op:
    """Registers op ``name`` lowered by ``opfn`` (which takes one xla_builder ``Op`` per input
    tensor, plus the call's keyword arguments)."""
    return Op(name, opfn)
