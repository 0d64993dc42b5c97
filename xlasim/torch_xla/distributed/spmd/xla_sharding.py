"""``torch_xla.distributed.spmd.xla_sharding`` on the simulator (torch_xla 2.9).

The functions and classes of the real module, with the same argument checks, messages and
order.  The mesh arithmetic is ``xlasim.sharding.mesh``, the C++
bindings are the simulated ``torch_xla._XLAC``; JAX/torchax interop raises NotImplementedError.

PYTEST_DONT_REWRITE: the asserts here are torch_xla's API (their messages are compared
with the real ones), so pytest must not rewrite them.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.runtime as xr
from torch import Tensor
from torch.amp import custom_bwd, custom_fwd
from torch_xla import _XLAC as _xlac
from torch_xla.distributed.spmd.xla_sharded_tensor import XLAShardedTensor

from xlasim.runtime import custom_ops as _custom_ops
from xlasim.sharding import mesh as _mesh
from xlasim.sharding.device_mesh import (
    create_device_mesh,
    create_hybrid_device_mesh,
    physical_tpu_mesh,
)
from xlasim.sharding.mesh import (
    PartitionSpec,
    ShardingType,
    replication_groups,
    resolve_axis_names,
    sharding_type_of,
    tile_assignment,
)

# No __all__: like torch_xla's module, `import *` exports every public name.


class Mesh(_mesh.Mesh):
    """Describe the logical XLA device topology mesh and the underlying resources.

    Args:
      device_ids: A flattened list of devices (IDs), reshaped row-major to ``mesh_shape``;
        each ID indexes into ``xr.global_runtime_device_attributes()``.
      mesh_shape: A int tuple describing the shape of the device mesh.
      axis_names: A sequence of mesh axis names; its length should match ``mesh_shape``.
    """

    op_sharding_type = _xlac.OpSharding

    def __init__(
        self,
        device_ids: np.ndarray | list[int],
        mesh_shape: tuple[int, ...],
        axis_names: tuple[str, ...] | None = None,
    ) -> None:
        super().__init__(
            device_ids, mesh_shape, axis_names, num_devices=xr.global_runtime_device_count()
        )

    @classmethod
    def from_str(cls, mesh_str: str) -> Mesh | None:
        """Create Mesh from string representation."""
        # Accepts ``str(mesh)``, with or without a leading "Mesh"; anything else is None.
        try:
            fields = ast.literal_eval(mesh_str.replace("Mesh", ""))
            ids, shape, names = (fields[k] for k in ("device_ids", "mesh_shape", "axis_names"))
            return cls(device_ids=np.array(ids), mesh_shape=shape, axis_names=names)
        except (ValueError, SyntaxError, KeyError, TypeError):
            return None

    def get_jax_mesh(self) -> Any:
        raise NotImplementedError("xlasim does not simulate JAX interop (Mesh.get_jax_mesh)")


_GLOBAL_MESH: Mesh | None = None


def set_global_mesh(mesh: Mesh) -> None:
    """Set the global mesh that can be used for the current process."""
    global _GLOBAL_MESH
    _GLOBAL_MESH = mesh


def get_global_mesh() -> Mesh | None:
    """Get the global mesh for the current process (None if not set)."""
    return _GLOBAL_MESH


def get_1d_mesh(axis_name: str | None = None) -> Mesh:
    """Helper function to return the mesh with all devices in one dimension."""
    count = xr.global_runtime_device_count()
    names = None if axis_name is None else (axis_name,)
    return Mesh(np.arange(count), (count,), names)


def _parse_xla_device(device: str) -> tuple[str, int]:
    """``torch_xla._internal.utils.parse_xla_device``."""
    m = re.match(r"([A-Z]+):(\d+)$", device)
    if m:
        return (m.group(1), int(m.group(2)))
    raise ValueError(f"Invalid device string: {device}")


class HybridMesh(Mesh):
    """A device mesh over ICI (within a slice) and DCN (across slices) connected devices,
    laid out on the slice's physical torus from ``xr.global_runtime_device_attributes()``.
    The logical mesh is ordered by increasing network intensity, e.g. [replica, data, model].
    """

    ici_mesh_shape: tuple[int, ...]
    dcn_mesh_shape: tuple[int, ...]

    def __init__(
        self,
        *,
        ici_mesh_shape: tuple[int, ...],
        dcn_mesh_shape: tuple[int, ...] | None = None,
        axis_names: tuple[str, ...] | None = None,
    ) -> None:
        dcn = tuple([1] * len(ici_mesh_shape)) if dcn_mesh_shape is None else dcn_mesh_shape
        assert len(ici_mesh_shape) == len(dcn)
        mesh_shape = tuple(ici * across for ici, across in zip(ici_mesh_shape, dcn, strict=False))
        attributes = xr.global_runtime_device_attributes()
        attributes.sort(key=lambda attr: _parse_xla_device(attr["name"])[1])
        self.device_attributes = attributes
        # Only multislice runtimes report a slice index; the dcn shape must agree with that.
        multislice = "slice_index" in attributes[0]
        n_slices = np.prod(dcn)
        if multislice and n_slices == 1:
            raise ValueError("Provide dcn_mesh_shape to create a mesh for multislice")
        if not multislice and n_slices > 1:
            raise ValueError("Invalid dcn_mesh_shape for single slice mesh")
        self.ici_mesh_shape, self.dcn_mesh_shape = ici_mesh_shape, dcn
        layout = (
            self._create_hybrid_device_mesh(ici_mesh_shape, dcn)
            if multislice and n_slices > 1
            else self._create_device_mesh(ici_mesh_shape)
        )
        super().__init__(layout.flatten(), mesh_shape, axis_names)

    def _get_physical_tpu_mesh(self, devices: np.ndarray) -> np.ndarray:
        assert xm.xla_device_hw(torch_xla.device()) == "TPU"
        return physical_tpu_mesh(self.device_attributes, devices)

    def _create_device_mesh(self, mesh_shape: Any, devices: Any = None) -> np.ndarray:
        if devices is None:
            devices = np.arange(xr.global_runtime_device_count())
        return create_device_mesh(
            self.device_attributes, mesh_shape, devices, physical_mesh=self._physical_mesh
        )

    def _create_hybrid_device_mesh(self, ici_mesh_shape: Any, dcn_mesh_shape: Any) -> np.ndarray:
        return create_hybrid_device_mesh(
            self.device_attributes,
            ici_mesh_shape,
            dcn_mesh_shape,
            physical_mesh=self._physical_mesh,
        )

    def _physical_mesh(self, _attributes: Any, devices: Any) -> np.ndarray:
        # The TPU check comes after the device-count check, where torch_xla makes it.
        return self._get_physical_tpu_mesh(devices)


def _mark_manual_sharding(t: torch.Tensor | XLAShardedTensor) -> XLAShardedTensor:
    """Meant to be paired with the pause_spmd & resume_spmd APIs; don't use it alone."""
    manual_sharding = _xlac.OpSharding([], [], [], ShardingType.MANUAL)
    _xlac._mark_manual_sharding(unwrap_sharded_tensor(t), manual_sharding)
    return wrap_as_sharded_tensor(t)


def enable_manual_sharding(
    t: torch.Tensor | XLAShardedTensor, partition_spec: PartitionSpec, *, mesh: Mesh | None = None
) -> XLAShardedTensor:
    """Shard ``t`` by ``partition_spec`` and switch it (and what it feeds) to manual sharding."""
    mesh = get_global_mesh() if mesh is None else mesh
    sharded = mark_sharding(unwrap_sharded_tensor(t), mesh, partition_spec)  # type: ignore[arg-type]
    local = _xlac._spmd_full_to_shard_shape(sharded.global_tensor)
    return wrap_as_sharded_tensor(
        local,
        mesh_shape=mesh.mesh_shape,  # type: ignore[union-attr]
        partition_spec=partition_spec,
    )


def disable_manual_sharding(
    t: torch.Tensor | XLAShardedTensor,
    partition_spec: PartitionSpec,
    full_shape: torch.Size,
    *,
    mesh: Mesh | None = None,
) -> XLAShardedTensor:
    """Return to automatic sharding: ``t`` becomes the full tensor sharded by the spec."""
    mesh = get_global_mesh() if mesh is None else mesh
    manual = _mark_manual_sharding(unwrap_sharded_tensor(t)).global_tensor
    sharding = mesh.get_op_sharding(partition_spec)  # type: ignore[union-attr]
    full = _xlac._spmd_shard_to_full_shape(manual, sharding, full_shape, manual.dtype)
    return wrap_as_sharded_tensor(
        full,
        mesh_shape=mesh.mesh_shape,  # type: ignore[union-attr]
        partition_spec=partition_spec,
    )


def annotate_custom_sharding(
    t: torch.Tensor | XLAShardedTensor, mesh: Mesh, partition_spec: PartitionSpec
) -> XLAShardedTensor:
    """Annotate ``t`` with a custom sharding IR node without moving its data."""
    assert len(t.shape) == len(partition_spec), (
        f"Partition spec length ({len(partition_spec)}) should be equal to the input rank "
        f"({len(t.shape)})."
    )

    op_sharding = mesh.get_op_sharding(partition_spec)
    _xlac._xla_annotate_custom_sharding(unwrap_sharded_tensor(t), op_sharding)
    return wrap_as_sharded_tensor(t, mesh_shape=mesh.mesh_shape, partition_spec=partition_spec)


def mark_sharding(
    t: torch.Tensor | XLAShardedTensor, mesh: Mesh, partition_spec: PartitionSpec
) -> XLAShardedTensor:
    """Annotate ``t`` in place with ``partition_spec`` over ``mesh``.

    Each spec entry is a mesh axis index (int), a mesh axis name (str), a tuple of those
    (shard over several axes), or None (replicate that tensor dimension).
    """
    # Fully specified partition specs only: their length must be the tensor's rank.
    assert len(t.shape) == len(partition_spec), (
        f"Partition spec length ({len(partition_spec)}) should be equal to the input rank "
        f"({len(t.shape)})."
    )

    op_sharding = mesh.get_op_sharding(partition_spec)
    _xlac._xla_mark_sharding(unwrap_sharded_tensor(t), op_sharding)
    # Pass mesh and partition spec information for DTensor compatibility
    return wrap_as_sharded_tensor(t, mesh_shape=mesh.mesh_shape, partition_spec=partition_spec)


def mark_sharding_with_gradients(
    t: torch.Tensor | XLAShardedTensor, mesh: Mesh, partition_spec: PartitionSpec
) -> torch.Tensor:
    """Shard an intermediate tensor (not in place) and its gradient in the backward pass."""
    assert len(t.shape) == len(partition_spec), (
        f"Partition spec length ({len(partition_spec)}) should be equal to the input rank "
        f"({len(t.shape)})."
    )

    r = MarkShardingFunction.apply(t, mesh, partition_spec)
    assert isinstance(r, torch.Tensor)
    return r


def shard_as(a: Any, b: Any) -> tuple[Any, Any]:
    raise NotImplementedError("xlasim does not simulate JAX interop (shard_as requires JAX)")


def clear_sharding(t: torch.Tensor | XLAShardedTensor) -> torch.Tensor:
    """Clear the sharding annotation of ``t`` in place; returns the (global) tensor."""
    _xlac._xla_clear_sharding(unwrap_sharded_tensor(t))
    if isinstance(t, XLAShardedTensor):
        return t.global_tensor
    return t


def wrap_as_sharded_tensor(
    t: torch.Tensor | XLAShardedTensor, mesh_shape: Any = None, partition_spec: Any = None
) -> XLAShardedTensor:
    if not isinstance(t, XLAShardedTensor):
        return XLAShardedTensor(t, mesh_shape=mesh_shape, partition_spec=partition_spec)
    given = {"mesh_shape": mesh_shape, "partition_spec": partition_spec}
    updates = {name: value for name, value in given.items() if value is not None}
    for name, value in updates.items():
        setattr(t, name, value)
    if updates:
        # A new layout makes the cached sharding spec stale (DTensor interop reads it).
        t.invalidate_spec_cache()
    return t


def unwrap_sharded_tensor(t: torch.Tensor | XLAShardedTensor) -> torch.Tensor:
    if isinstance(t, XLAShardedTensor):
        return t.global_tensor
    return t


def wrap_if_sharded(x: Any) -> Any:
    """If the input is a sharded tensor, return an XLAShardedTensor wrapping it."""
    if (
        isinstance(x, torch.Tensor)
        and not isinstance(x, XLAShardedTensor)
        and x.device.type == "xla"
        and _xlac._get_xla_sharding_type(x) is not None
    ):
        return XLAShardedTensor(x)
    return x


@dataclass
class ShardingSpec:
    mesh: Mesh
    partition_spec: PartitionSpec
    minibatch: bool | None = False

    # Derived fields
    _tile_assignment: list[int] = field(init=False)
    _group_assignment: list[int] = field(init=False)
    _replication_groups: list[int] = field(init=False)
    _sharding_type: ShardingType = field(init=False)

    def __post_init__(self) -> None:
        # Unlike Mesh.get_op_sharding, no bounds checks and no PARTIAL for short specs.
        spec = resolve_axis_names(self.mesh, self.partition_spec)
        tiles = tile_assignment(self.mesh, spec)
        self._tile_assignment = tiles.tolist()
        self._sharding_type = sharding_type_of(spec, xr.global_runtime_device_count())
        self._group_assignment, self._replication_groups = replication_groups(
            self._sharding_type, tiles, spec
        )

    def xla_spec(self, t: torch.Tensor) -> Any:
        """An XlaShardingSpec for ``t``, or None when the spec does not fit its rank."""
        if not self.can_apply(t):
            return None
        return _xlac.XlaShardingSpec(
            t,
            self._tile_assignment,
            self._group_assignment,
            self._replication_groups,
            int(self._sharding_type),
            bool(self.minibatch),
        )

    def can_apply(self, t: torch.Tensor) -> bool:
        """Test whether the ShardingSpec is compatible with the given torch.Tensor."""
        return len(t.shape) == len(self.partition_spec)

    def apply(self, t: torch.Tensor) -> None:
        assert t.device == torch_xla.device()
        mark_sharding(t, self.mesh, self.partition_spec)


# -- einsum-backed linear (sharding-propagation friendly) ------------------------------------
class XLAPatchedLinear(torch.autograd.Function):
    """``torch.nn.functional.linear`` through einsum, so sharded dims are not flattened."""

    @staticmethod
    @custom_fwd(device_type="xla", cast_inputs=torch.get_autocast_dtype("xla"))
    def forward(ctx: Any, input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:  # noqa: A002
        ctx.save_for_backward(input, weight, bias)
        return torch.ops.xla.einsum_linear_forward(input, weight, bias)

    @staticmethod
    @custom_bwd(device_type="xla")
    def backward(ctx: Any, grad_output: Tensor) -> Any:
        x, weight, bias = ctx.saved_tensors
        needs = ctx.needs_input_grad
        # Without a bias, apply() may have been given two inputs only: no needs[2] then.
        want_bias = bias is not None and needs[2]
        grads = torch.ops.xla.einsum_linear_backward(
            grad_output, x, weight, bias, needs[0], needs[1], want_bias
        )
        return (*grads, None)


def xla_patched_nn_linear_forward(m: torch.nn.Module, input: Tensor) -> Tensor:  # noqa: A002
    return XLAPatchedLinear.apply(input, m.weight, m.bias)


class EinsumLinear(torch.nn.Linear):
    """A `torch.nn.Linear` subclass implemented with `einsum`."""

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        t = xla_patched_nn_linear_forward(self, input)
        assert isinstance(t, torch.Tensor)
        return t


def apply_xla_patch_to_nn_linear(module: torch.nn.Module) -> torch.nn.Module:
    """Recursively replace `nn.Linear` layers with `EinsumLinear` in the module."""
    for name, child in module.named_children():
        if isinstance(child, torch.nn.Linear) and not isinstance(child, EinsumLinear):
            setattr(module, name, _as_einsum_linear(child))
        else:
            apply_xla_patch_to_nn_linear(child)
    return module


def _as_einsum_linear(linear: torch.nn.Linear) -> EinsumLinear:
    # Built on meta, then assign=True adopts the original parameters (no copy, no init).
    with torch.device("meta"):
        einsum = EinsumLinear(linear.in_features, linear.out_features, linear.bias is not None)
    einsum.load_state_dict(linear.state_dict(), strict=True, assign=True)
    return einsum


def apply_backward_optimization_barrier(m: torch.nn.Module) -> None:
    """Register a full backward hook applying an optimization barrier to the module."""

    def optimization_barrier(module: Any, grad_input: Any, grad_output: Any) -> None:
        gradients = [p.grad for p in module.parameters() if p.grad is not None]
        xm.optimization_barrier_(
            [g for g in gradients + list(grad_input) if isinstance(g, torch.Tensor)]
        )

    m.register_full_backward_hook(optimization_barrier)


class MarkShardingFunction(torch.autograd.Function):
    """mark_sharding on an intermediate tensor (not in place) and on its gradient."""

    @staticmethod
    def forward(ctx: Any, torch_tensor: torch.Tensor, mesh: Mesh, partition_spec: Any) -> Any:
        # The op takes strings: mesh and spec are not tensors a custom op can carry.
        ctx.mesh, ctx.partition_spec = mesh, partition_spec
        return _aot_mark_sharding(torch_tensor, str(mesh), str(partition_spec))

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Any:
        # The gradient gets the same sharding as the forward value.
        grad = _aot_mark_sharding(grad_output, str(ctx.mesh), str(ctx.partition_spec))
        return grad, None, None


def _mark_sharding_from_strings(t: Tensor, mesh: str, partition_spec: str) -> Tensor:
    """The kernel of ``xla::aot_mark_sharding``: its arguments come as strings."""
    parsed_mesh = Mesh.from_str(mesh)
    assert parsed_mesh is not None
    spec = ast.literal_eval(partition_spec)
    return mark_sharding(t.clone(), parsed_mesh, spec).global_tensor


_custom_ops.set_mark_sharding_kernel(_mark_sharding_from_strings)
_aot_mark_sharding = _custom_ops.aot_mark_sharding
