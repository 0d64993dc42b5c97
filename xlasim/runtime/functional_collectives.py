"""What torch's traceable collectives (``torch.ops._c10d_functional.*``) run on xla tensors.

torch_xla 2.9 gives four of them XLA kernels (``all_reduce``, ``all_gather_into_tensor``,
``reduce_scatter_tensor``, ``all_to_all_single``): ``dist.*`` collectives called inside a
``torch.compile``d function, and ``xm.all_reduce``, reach XLA's collectives through them.  The
simulator's xla tensors are a Python dispatch subclass, so without a rule the ops would reach
torch's CPU kernels, which look for a CPU backend in the process group.

The rules are registered once per process (a rule cannot be registered twice) and run the
kernels the simulated ``torch_xla`` in use installs here with ``set_kernel``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from xlasim.runtime.tensor import XlaSimTensor

OPS = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single")

_kernels: dict[str, Callable[..., torch.Tensor]] = {}


def set_kernel(op_name: str, kernel: Callable[..., torch.Tensor]) -> None:
    """``kernel`` runs ``_c10d_functional::<op_name>`` on simulated xla tensors from now on."""
    if op_name not in OPS:
        raise ValueError(f"torch_xla gives _c10d_functional::{op_name} no XLA kernel")
    _kernels[op_name] = kernel


def _rule(op_name: str) -> Callable[..., torch.Tensor]:
    def run(_cls: object, _func: object, _types: object, args: Any, kwargs: Any) -> torch.Tensor:
        kernel = _kernels.get(op_name)
        if kernel is None:
            raise RuntimeError(
                f"_c10d_functional::{op_name} on an xla tensor needs the simulated torch_xla: "
                "import torch_xla"
            )
        return kernel(*args, **kwargs)

    return run


for _name in OPS:
    torch.library.register_torch_dispatch(f"_c10d_functional::{_name}", XlaSimTensor, _rule(_name))
