"""FSDP written with SPMD sharding annotations (torch_xla's "FSDPv2").

Wrapping a module shards each of its parameters over the mesh's ``fsdp`` axis (along the
parameter's largest dimension) and the forward's output over the batch dimension; the
simulated SPMD partitioner then computes with those shardings, so results equal the
unwrapped module's.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch_xla
import torch_xla.distributed.spmd as spmd
from torch import nn
from torch_xla.distributed.fsdp.wrap import _wrap_children

__all__ = ["SpmdFullyShardedDataParallel"]

_AXIS = "fsdp"


def _partition_spec(
    shape: torch.Size, extra_data_axis: str | None = None, shard_maximal: bool = False
) -> tuple[Any, ...]:
    """One entry per dimension: the fsdp axis (with ``extra_data_axis`` before it) on the
    first dimension, or on the first largest one with ``shard_maximal``; a scalar stays
    replicated."""
    if not shape:
        return ()
    spec: list[Any] = [None] * len(shape)
    dim = list(shape).index(max(shape)) if shard_maximal else 0
    spec[dim] = (extra_data_axis, _AXIS) if extra_data_axis else _AXIS
    return tuple(spec)


def _has_own_forward(module: nn.Module) -> bool:
    forward = getattr(getattr(module, "forward", None), "__func__", None)
    return forward is not None and forward is not nn.Module.forward


def _given_or_global(mesh: spmd.Mesh | None) -> spmd.Mesh:
    """The mesh to shard over: the one given, else the global one; there must be one."""
    chosen = spmd.get_global_mesh() if mesh is None else mesh
    if chosen is None:
        raise ValueError("No mesh is provided and no global mesh is set. Please provide a mesh.")
    return chosen


class SpmdFullyShardedDataParallel(nn.Module):
    """Shards ``module``'s parameters over ``mesh``'s ``fsdp`` axis and its output's batch
    dimension (``extra_data_axis`` joins the batch sharding on a multi-slice mesh).

    ``mesh`` defaults to the global mesh. ``shard_output(output, mesh)`` replaces the default
    output sharding (which shards a tensor output, or the first element of a tuple).
    ``auto_wrap_policy`` wraps the submodules it picks first, each with
    ``auto_wrapper_callable`` (default: this class); parameters already sharded (by an inner
    wrapper or by the program) keep their sharding.
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        mesh: spmd.Mesh | None = None,
        shard_output: Callable[[Any, spmd.Mesh], None] | None = None,
        auto_wrap_policy: Callable[..., bool] | None = None,
        auto_wrapper_callable: Callable[..., Any] | None = None,
        extra_data_axis: str | None = None,
    ) -> None:
        if isinstance(module, SpmdFullyShardedDataParallel):
            raise RuntimeError(
                "Cannot wrap a module that is already wrapped with FSDP. For nested FSDP, "
                "first wrap the inner child modules before wrapping the outer parent module."
            )
        if not _has_own_forward(module):
            raise RuntimeError(
                "The module wrapped by FSDP *must define a `forward` method and call it "
                "during the module's forward pass for FSDP to work correctly.* "
                "Hence, do not wrap `nn.ModuleList` or `nn.ModuleDict` with FSDP "
                "(since they don't have `forward` defined), "
                "and do not perform the forward pass in other ways apart from the `forward` "
                "method. (i.e. you should directly call the FSDP-wrapped module itself in "
                "your code, instead of using any of its submodules or its weights)."
            )
        mesh = _given_or_global(mesh)
        if _AXIS not in mesh.axis_names:
            raise ValueError("The mesh must have an axis named 'fsdp'.")
        if extra_data_axis and extra_data_axis not in mesh.axis_names:
            raise ValueError(f"The provided {extra_data_axis} axis is not in the mesh.")
        super().__init__()

        if auto_wrap_policy is not None:
            self._wrap_children(module, auto_wrap_policy, auto_wrapper_callable, mesh, shard_output)
        self._orig_module = module.to("xla")
        self._mesh = mesh
        for param in module.parameters():
            if torch_xla._XLAC._get_xla_sharding_spec(param) == "":
                spmd.mark_sharding(param, mesh, _partition_spec(param.shape, shard_maximal=True))
        spmd.xla_sharding.apply_backward_optimization_barrier(module)
        if shard_output is None:

            def shard_output(output: Any, mesh: spmd.Mesh) -> None:
                _shard_batch(output, mesh, extra_data_axis)

        self._shard_output = shard_output

    @staticmethod
    def _wrap_children(
        module: nn.Module,
        policy: Callable[..., bool],
        wrapper: Callable[..., Any] | None,
        mesh: spmd.Mesh,
        shard_output: Callable[[Any, spmd.Mesh], None] | None,
    ) -> None:
        # The children share the mesh and the output sharding; extra_data_axis and the policy
        # itself stay with the outermost wrapper, as in torch_xla.
        _wrap_children(
            module,
            policy,
            wrapper or SpmdFullyShardedDataParallel,
            SpmdFullyShardedDataParallel,
            "SpmdFullyShardedDataParallel",
            mesh=mesh,
            shard_output=shard_output,
        )

    @property
    def module(self) -> nn.Module:
        """The wrapped module (as ``model.module`` of DDP)."""
        return self._orig_module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        output = self.module(*args, **kwargs)
        self._shard_output(output, self._mesh)
        return output

    def __getattr__(self, name: str) -> Any:
        # Attributes the wrapper lacks are the wrapped module's (model.fc1 of a wrapped model).
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.module, name)

    def __getitem__(self, key: int) -> nn.Module:
        """Index the wrapped module (an ``nn.Sequential``)."""
        return self.module.__getitem__(key)  # type: ignore[operator]


def _shard_batch(output: Any, mesh: spmd.Mesh, extra_data_axis: str | None) -> None:
    """The default output sharding: the batch dimension of the output tensor, or of the
    first element of a tuple output, over the fsdp axis."""
    target = None
    if isinstance(output, torch.Tensor):
        target = output
    elif isinstance(output, tuple):
        target = output[0] if isinstance(output[0], torch.Tensor) else None
        warnings.warn(
            "The output is a tuple, but only the first element is sharded. If this is not "
            "intended, please provide your own shard_output callable.",
            stacklevel=3,
        )
    if target is None:
        raise RuntimeError(
            f"The output type is not supported: {type(output)}. Please provide your own "
            "shard_output callable."
        )
    spmd.mark_sharding(target, mesh, _partition_spec(target.shape, extra_data_axis))
