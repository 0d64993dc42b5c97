"""``torch_xla.distributed.spmd.api`` on the simulator: DTensor-style entry points (2.9).

PYTEST_DONT_REWRITE: the asserts here are torch_xla's API (their messages are compared
with the real ones), so pytest must not rewrite them.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn as nn
import torch_xla
import torch_xla.runtime as xr
from torch.distributed import DeviceMesh
from torch.distributed.tensor.placement_types import Placement, Replicate
from torch_xla.distributed.spmd import Mesh, ShardingType, XLAShardedTensor, mark_sharding

log = logging.getLogger(__name__)


class _SpmdOn(contextlib.ContextDecorator):
    """Turns SPMD on when entered (it stays on, as it does in torch_xla)."""

    def __enter__(self) -> _SpmdOn:
        xr.use_spmd()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        return None


def with_xla(func: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``func`` so that SPMD mode is on before it runs (every entry point here is)."""
    assert func is not None
    return _SpmdOn()(func)


def auto_policy(mod_name: str, mod: nn.Module, mesh: Any) -> None:
    """Pass as ``partition_fn`` to ``xla_distribute_module`` to request auto-sharding."""
    return


@with_xla
def convert_to_xla_mesh(dt_mesh: DeviceMesh) -> Mesh:
    """Convert a DTensor ``DeviceMesh`` over 'xla' to a torch_xla ``Mesh``."""
    # An XLA mesh spans every device of the slice; so must the DeviceMesh.
    assert dt_mesh.size() == xr.global_runtime_device_count()
    grid = dt_mesh.mesh
    return Mesh(grid.flatten(), tuple(grid.shape), dt_mesh.mesh_dim_names)


@with_xla
def convert_to_xla_partition_spec(
    tensor: torch.Tensor, placements: Sequence[Placement]
) -> tuple[Any, ...]:
    """Convert DTensor ``placements`` (per mesh dim) to a partition spec (per tensor dim)."""
    spec: list[Any] = [None] * tensor.dim()
    for mesh_dim, placement in enumerate(placements):
        if not (placement.is_shard() or placement.is_replicate()):
            raise ValueError(f"Unsupported placement type: {type(placement).__name__}")
        if placement.is_shard():  # a Replicate() leaves its tensor dims unsharded
            spec[placement.dim] = mesh_dim  # type: ignore[attr-defined]
    return tuple(spec)


def _global_tensor(tensor: torch.Tensor) -> Any:
    # Checked by class name, as torch_xla does, so DTensor need not be importable.
    kind = type(tensor).__name__
    if kind == "DTensor":
        raise ValueError(
            "Cannot distribute a DTensor with local tensor on xla devices."
            "The input tensor must be global."
        )
    if kind != "XLAShardedTensor":
        return tensor
    current = tensor.sharding_type  # type: ignore[attr-defined]
    assert current is None or current == ShardingType.REPLICATED, (
        "XLAShardedTensor `tensor` is already annotated with non-replication sharding. "
    )
    return tensor.global_tensor  # type: ignore[attr-defined]


@with_xla
def xla_distribute_tensor(
    tensor: torch.Tensor,
    device_mesh: DeviceMesh,
    placements: Sequence[Placement] | None = None,
) -> XLAShardedTensor:
    """Distribute ``tensor`` over ``device_mesh`` by ``placements`` (default: replicated)."""
    assert device_mesh.device_type == "xla"
    xla_mesh = convert_to_xla_mesh(device_mesh)
    assert xla_mesh.mesh_shape == tuple(device_mesh.mesh.size())

    if not tensor.is_meta:
        tensor = tensor.to(device_mesh.device_type)
    if placements is None:
        placements = [Replicate() for _ in range(device_mesh.ndim)]
    # torch_xla's messages stop here (their second halves are stray expressions upstream).
    assert len(placements) == device_mesh.ndim, (
        "`placements` must have the same length as `device_mesh.ndim`! "
    )
    spec = convert_to_xla_partition_spec(tensor, placements)
    assert len(tensor.shape) == len(spec), (
        "`partition_spec` from `placements` must have the same length as `tensor.length`! "
    )
    global_tensor = _global_tensor(tensor)
    assert global_tensor is not None, "distributing a tensor should not be None"
    return mark_sharding(global_tensor, xla_mesh, spec)


def _mesh_hook(fn: Callable[..., Any], device_mesh: Any, role: str) -> Callable[..., Any]:
    """``fn`` as a hook taking (module, value); the two-argument form is deprecated."""
    n_args = len(inspect.signature(fn).parameters)
    if n_args == 2:
        warnings.warn(
            f"Deprecating {role} that takes two arguments (inputs, device_mesh), "
            f"please use {role} that takes in (module, inputs, device_mesh) instead!",
            stacklevel=3,
        )
        return lambda _module, value: fn(value, device_mesh)
    if n_args == 3:
        return lambda module, value: fn(module, value, device_mesh)
    raise ValueError(f"{role} should take in 3 arguments, but got {n_args} arguments!")


@with_xla
def xla_distribute_module(
    module: nn.Module,
    device_mesh: DeviceMesh | None = None,
    partition_fn: Callable[[str, nn.Module, DeviceMesh], None] | None = None,
    input_fn: Callable[..., None] | None = None,
    output_fn: Callable[..., None] | None = None,
) -> nn.Module:
    """Annotate ``module``'s parameters via ``partition_fn`` and install input/output hooks."""
    if partition_fn and getattr(partition_fn, "__name__", "unknown") == "auto_policy":
        assert next(module.parameters()).device != torch_xla.device(), (
            "Currently requires module to be on cpu, before xla_distribute_module."
        )
        xr.use_spmd(auto=True)
        module = module.to("xla")
    elif partition_fn:
        for name, submodule in module.named_modules():
            partition_fn(name, submodule, device_mesh)  # type: ignore[arg-type]

    # The input hook is in place before output_fn is checked, as in torch_xla.
    if input_fn is not None:
        module.register_forward_pre_hook(_mesh_hook(input_fn, device_mesh, "input_fn"))
    if output_fn is not None:
        on_output = _mesh_hook(output_fn, device_mesh, "output_fn")
        module.register_forward_hook(lambda mod, _inputs, outputs: on_output(mod, outputs))
    return module
