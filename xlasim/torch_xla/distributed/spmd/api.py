"""``torch_xla.distributed.spmd.api`` on the simulator: DTensor-style entry points (2.9).

PYTEST_DONT_REWRITE: the asserts here are torch_xla's API (their messages are compared
with the real ones), so pytest must not rewrite them.
"""

from __future__ import annotations

import inspect
import logging
import warnings
from collections.abc import Callable, Sequence
from functools import wraps
from typing import Any

import torch
import torch.nn as nn
import torch_xla
import torch_xla.runtime as xr
from torch.distributed import DeviceMesh
from torch.distributed.tensor.placement_types import Placement, Replicate
from torch_xla.distributed.spmd import (
    Mesh,
    ShardingType,
    XLAShardedTensor,
    mark_sharding,
)

log = logging.getLogger(__name__)


def with_xla(func: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``func`` with SPMD enabled (torch_xla's test helper, applied to the API)."""
    assert func is not None

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        xr.use_spmd()
        return func(*args, **kwargs)

    return wrapper


def auto_policy(mod_name: str, mod: nn.Module, mesh: Any) -> None:
    """Pass as ``partition_fn`` to ``xla_distribute_module`` to request auto-sharding."""
    return


@with_xla
def convert_to_xla_mesh(dt_mesh: DeviceMesh) -> Mesh:
    """Convert a DTensor ``DeviceMesh`` over 'xla' to a torch_xla ``Mesh``."""
    assert dt_mesh.size() == xr.global_runtime_device_count()
    return Mesh(dt_mesh.mesh.flatten(), tuple(dt_mesh.mesh.size()), dt_mesh.mesh_dim_names)


@with_xla
def convert_to_xla_partition_spec(
    tensor: torch.Tensor, placements: Sequence[Placement]
) -> tuple[Any, ...]:
    """Convert DTensor ``placements`` (per mesh dim) to a partition spec (per tensor dim)."""
    sharding_spec: list[Any] = [None] * len(tensor.shape)
    for mesh_idx, spec in enumerate(placements):
        if spec.is_shard():
            tensor_idx = spec.dim  # type: ignore[attr-defined]
            sharding_spec[tensor_idx] = mesh_idx
        elif spec.is_replicate():
            continue
        else:
            raise ValueError(f"Unsupported placement type: {type(spec).__name__}")
    return tuple(sharding_spec)


@with_xla
def xla_distribute_tensor(
    tensor: torch.Tensor,
    device_mesh: DeviceMesh,
    placements: Sequence[Placement] | None = None,
) -> XLAShardedTensor:
    """Distribute ``tensor`` over ``device_mesh`` by ``placements`` (default: replicated)."""
    dt_mesh = device_mesh
    assert dt_mesh.device_type == "xla"

    xla_mesh = convert_to_xla_mesh(dt_mesh)
    assert xla_mesh.mesh_shape == tuple(dt_mesh.mesh.size())

    if not tensor.is_meta:
        tensor = tensor.to(dt_mesh.device_type)
    if placements is None:
        placements = [Replicate() for _ in range(dt_mesh.ndim)]
    assert len(placements) == dt_mesh.ndim, (
        "`placements` must have the same length as `device_mesh.ndim`! "
    )
    partition_spec = convert_to_xla_partition_spec(tensor, placements)
    assert len(tensor.shape) == len(partition_spec), (
        "`partition_spec` from `placements` must have the same length as `tensor.length`! "
    )

    global_tensor = tensor
    if type(tensor).__name__ == "DTensor":
        raise ValueError(
            "Cannot distribute a DTensor with local tensor on xla devices."
            "The input tensor must be global."
        )
    if type(tensor).__name__ == "XLAShardedTensor":
        sharding_type = tensor.sharding_type  # type: ignore[attr-defined]
        assert sharding_type is None or sharding_type == ShardingType.REPLICATED, (
            "XLAShardedTensor `tensor` is already annotated with non-replication sharding. "
        )
        global_tensor = tensor.global_tensor  # type: ignore[attr-defined]
    assert global_tensor is not None, "distributing a tensor should not be None"

    return mark_sharding(global_tensor, xla_mesh, partition_spec)


@with_xla
def xla_distribute_module(
    module: nn.Module,
    device_mesh: DeviceMesh | None = None,
    partition_fn: Callable[[str, nn.Module, DeviceMesh], None] | None = None,
    input_fn: Callable[..., None] | None = None,
    output_fn: Callable[..., None] | None = None,
) -> nn.Module:
    """Annotate ``module``'s parameters via ``partition_fn`` and install input/output hooks."""
    if partition_fn:
        if getattr(partition_fn, "__name__", "unknown") == "auto_policy":
            assert next(module.parameters()).device != torch_xla.device(), (
                "Currently requires module to be on cpu, before xla_distribute_module."
            )
            xr.use_spmd(auto=True)
            module = module.to("xla")
        else:
            for name, submod in module.named_modules():
                partition_fn(name, submod, device_mesh)  # type: ignore[arg-type]

    if input_fn is not None:
        num_args = len(inspect.signature(input_fn).parameters)
        if num_args == 2:
            warnings.warn(
                "Deprecating input_fn that takes two arguments (inputs, device_mesh), "
                "please use input_fn that takes in (module, inputs, device_mesh) instead!",
                stacklevel=2,
            )
            module.register_forward_pre_hook(lambda _, inputs: input_fn(inputs, device_mesh))
        elif num_args == 3:
            module.register_forward_pre_hook(lambda mod, inputs: input_fn(mod, inputs, device_mesh))
        else:
            raise ValueError(f"input_fn should take in 3 arguments, but got {num_args} arguments!")

    if output_fn is not None:
        num_args = len(inspect.signature(output_fn).parameters)
        if num_args == 2:
            warnings.warn(
                "Deprecating output_fn that takes two arguments (inputs, device_mesh), "
                "please use output_fn that takes in (module, inputs, device_mesh) instead!",
                stacklevel=2,
            )
            module.register_forward_hook(
                lambda mod, inputs, outputs: output_fn(outputs, device_mesh)
            )
        elif num_args == 3:
            module.register_forward_hook(
                lambda mod, inputs, outputs: output_fn(mod, outputs, device_mesh)
            )
        else:
            raise ValueError(f"output_fn should take in 3 arguments, but got {num_args} arguments!")

    return module
