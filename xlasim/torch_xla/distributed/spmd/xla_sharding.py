"""``torch_xla.distributed.spmd.xla_sharding`` on the simulator (torch_xla 2.9).

The functions and classes of the real module, with the same argument checks, messages and
order.  The mesh arithmetic is ``xlasim.sharding.mesh``, the C++
bindings are the simulated ``torch_xla._XLAC``; JAX/torchax interop raises NotImplementedError.

PYTEST_DONT_REWRITE: the asserts here are torch_xla's API (their messages are compared
with the real ones), so pytest must not rewrite them.
"""

from __future__ import annotations

import ast
import sys
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
from xlasim.runtime import jax_interop
from xlasim.runtime import state as _runtime_state
from xlasim.runtime.tensor import XlaSimTensor
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
    """A logical grid over every device of the simulated slice (see ``xlasim.sharding.Mesh``).

    Args:
      device_ids: every global device id once, laid out row-major over ``mesh_shape``.
      mesh_shape: the size of each mesh axis.
      axis_names: optional names for the axes, one each.
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
        """The mesh that ``str(mesh)`` described, or None for text that is not one."""
        # Accepts ``str(mesh)``, with or without a leading "Mesh"; anything else is None.
        try:
            fields = ast.literal_eval(mesh_str.replace("Mesh", ""))
            ids, shape, names = (fields[k] for k in ("device_ids", "mesh_shape", "axis_names"))
            return cls(device_ids=np.array(ids), mesh_shape=shape, axis_names=names)
        except (ValueError, SyntaxError, KeyError, TypeError):
            return None

    def get_jax_mesh(self) -> Any:
        """The JAX mesh of the same device ids, shape and axis names: on a simulated TPU,
        libtpu's descriptions of the slice's devices (JAX can lower for them; call_jax cannot
        run on them here), under PJRT_DEVICE=CPU JAX's CPU devices."""
        names = self.axis_names or tuple(str(i) for i in range(len(self.mesh_shape)))
        ids = np.asarray(self.device_ids).reshape(self.mesh_shape)
        return jax_interop.jax_mesh(_runtime_state.current(), ids, names)


def set_global_mesh(mesh: Mesh) -> None:
    """Remembers ``mesh`` as this process's default (``get_global_mesh`` returns it)."""
    # Kept on the runtime, not in this module: a nested simulation is a process of its own.
    _runtime_state.current().global_mesh = mesh


def get_global_mesh() -> Mesh | None:
    """The mesh ``set_global_mesh`` stored, or None."""
    mesh: Mesh | None = _runtime_state.current().global_mesh
    return mesh


def get_1d_mesh(axis_name: str | None = None) -> Mesh:
    """A one-axis mesh over every device, in device order."""
    count = xr.global_runtime_device_count()
    names = None if axis_name is None else (axis_name,)
    return Mesh(np.arange(count), (count,), names)


def _device_ordinal(attributes: dict[str, Any]) -> int:
    # Runtime device names are '<TYPE>:<global ordinal>'.
    return int(attributes["name"].rpartition(":")[2])


class HybridMesh(Mesh):
    """A mesh laid out on the chips' physical torus (``ici_mesh_shape``), repeated across
    slices (``dcn_mesh_shape``).

    List the axes from least to most communication-heavy (say replica, data, model): the
    heaviest get the best-connected devices.
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
        attributes.sort(key=_device_ordinal)
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


# Meshes and specs arrive from user code as given; these helpers hold what every annotation
# entry point does with them.
def _require_full_spec(t: torch.Tensor, partition_spec: PartitionSpec) -> None:
    # One entry per tensor dim, never fewer: the replication groups depend on the rank.
    assert len(t.shape) == len(partition_spec), (
        f"Partition spec length ({len(partition_spec)}) should be equal to the input rank "
        f"({len(t.shape)})."
    )


def _with_layout(t: Any, mesh: Any, partition_spec: PartitionSpec) -> XLAShardedTensor:
    # The layout rides along on the wrapper for DTensor interop (placements, redistribute).
    return wrap_as_sharded_tensor(t, mesh_shape=mesh.mesh_shape, partition_spec=partition_spec)


def _mesh_or_global(mesh: Mesh | None) -> Any:
    return get_global_mesh() if mesh is None else mesh


def _annotate(
    t: torch.Tensor | XLAShardedTensor, mesh: Mesh, partition_spec: PartitionSpec, binding: Any
) -> XLAShardedTensor:
    """Checks the spec, hands its OpSharding to ``binding`` and returns ``t`` with the layout."""
    _require_full_spec(t, partition_spec)
    torchax_tensor = sys.modules.get("torchax.tensor")
    if torchax_tensor is not None and isinstance(t, torchax_tensor.Tensor):
        # Inside a JAX trace (assume_pure): a sharding constraint over the mesh's JAX devices.
        jax_interop.layer().constrain(t, mesh.get_jax_mesh(), tuple(partition_spec))
        # torch_xla hands the torchax tensor back as it is.
        return t
    sharding = mesh.get_op_sharding(partition_spec)
    binding(unwrap_sharded_tensor(t), sharding)
    return _with_layout(t, mesh, partition_spec)


def _mark_manual_sharding(t: torch.Tensor | XLAShardedTensor) -> XLAShardedTensor:
    """Meant to be paired with the pause_spmd & resume_spmd APIs; don't use it alone."""
    # No tile assignment: under MANUAL each device keeps whatever data it holds.
    manual = _xlac.OpSharding([], [], [], ShardingType.MANUAL)
    _xlac._mark_manual_sharding(unwrap_sharded_tensor(t), manual)
    return wrap_as_sharded_tensor(t)


def enable_manual_sharding(
    t: torch.Tensor | XLAShardedTensor, partition_spec: PartitionSpec, *, mesh: Mesh | None = None
) -> XLAShardedTensor:
    """Shard ``t`` by ``partition_spec`` and switch it (and what it feeds) to manual sharding."""
    mesh = _mesh_or_global(mesh)
    annotated = mark_sharding(unwrap_sharded_tensor(t), mesh, partition_spec)
    per_device = _xlac._spmd_full_to_shard_shape(annotated.global_tensor)
    return _with_layout(per_device, mesh, partition_spec)


def disable_manual_sharding(
    t: torch.Tensor | XLAShardedTensor,
    partition_spec: PartitionSpec,
    full_shape: torch.Size,
    *,
    mesh: Mesh | None = None,
) -> XLAShardedTensor:
    """Return to automatic sharding: ``t`` becomes the full tensor sharded by the spec."""
    mesh = _mesh_or_global(mesh)
    manual = _mark_manual_sharding(unwrap_sharded_tensor(t)).global_tensor
    target = mesh.get_op_sharding(partition_spec)
    full = _xlac._spmd_shard_to_full_shape(manual, target, full_shape, manual.dtype)
    return _with_layout(full, mesh, partition_spec)


def annotate_custom_sharding(
    t: torch.Tensor | XLAShardedTensor, mesh: Mesh, partition_spec: PartitionSpec
) -> XLAShardedTensor:
    """Attaches the sharding to ``t``'s IR as a custom-sharding node; its data stays put."""
    return _annotate(t, mesh, partition_spec, _xlac._xla_annotate_custom_sharding)


def mark_sharding(
    t: torch.Tensor | XLAShardedTensor, mesh: Mesh, partition_spec: PartitionSpec
) -> XLAShardedTensor:
    """Annotate ``t`` in place with ``partition_spec`` over ``mesh``.

    Each spec entry is a mesh axis index (int), a mesh axis name (str), a tuple of those
    (shard over several axes), or None (replicate that tensor dimension).
    """
    return _annotate(t, mesh, partition_spec, _xlac._xla_mark_sharding)


def mark_sharding_with_gradients(
    t: torch.Tensor | XLAShardedTensor, mesh: Mesh, partition_spec: PartitionSpec
) -> torch.Tensor:
    """Shard an intermediate tensor (not in place) and its gradient in the backward pass."""
    _require_full_spec(t, partition_spec)
    # Autograd calls MarkShardingFunction.backward for the gradient's annotation.
    return MarkShardingFunction.apply(t, mesh, partition_spec)


def shard_as(a: Any, b: Any) -> tuple[Any, Any]:
    raise NotImplementedError("xlasim does not simulate JAX interop (shard_as requires JAX)")


def clear_sharding(t: torch.Tensor | XLAShardedTensor) -> torch.Tensor:
    """Clear the sharding annotation of ``t`` in place; returns the (global) tensor."""
    device_tensor = unwrap_sharded_tensor(t)
    _xlac._xla_clear_sharding(device_tensor)
    return device_tensor


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
    return t.global_tensor if isinstance(t, XLAShardedTensor) else t


def wrap_if_sharded(x: Any) -> Any:
    """``x`` as an XLAShardedTensor when it is an xla tensor with a sharding, else ``x``."""
    # Only a bare xla tensor can need a wrapper; anything else comes back unchanged.
    if isinstance(x, XLAShardedTensor) or not isinstance(x, torch.Tensor):
        return x
    annotated = xm.is_xla_tensor(x) and _xlac._get_xla_sharding_type(x) is not None
    return XLAShardedTensor(x) if annotated else x


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
        derived = (self._tile_assignment, self._group_assignment, self._replication_groups)
        kind, minibatch = int(self._sharding_type), bool(self.minibatch)
        return _xlac.XlaShardingSpec(t, *derived, kind, minibatch) if self.can_apply(t) else None

    def can_apply(self, t: torch.Tensor) -> bool:
        """Whether the spec has one entry per dimension of ``t``."""
        return t.dim() == len(self.partition_spec)

    def apply(self, t: torch.Tensor) -> None:
        assert t.device == torch_xla.device()
        mark_sharding(t, self.mesh, self.partition_spec)


# -- einsum-backed linear (sharding-propagation friendly) ------------------------------------
class XLAPatchedLinear(torch.autograd.Function):
    """``torch.nn.functional.linear`` through einsum, so sharded dims are not flattened."""

    @staticmethod
    @custom_fwd(device_type="xla", cast_inputs=torch.get_autocast_dtype("xla"))
    def forward(ctx: Any, input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:  # noqa: A002
        # The op (not a bare einsum) keeps AOTAutograd from decomposing it.
        out = _custom_ops.einsum_linear_forward(input, weight, bias)
        ctx.save_for_backward(input, weight, bias)
        return out

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
    """``nn.Linear`` whose forward and backward are einsums (see ``XLAPatchedLinear``)."""

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002
        return XLAPatchedLinear.apply(input, self.weight, self.bias)


def apply_xla_patch_to_nn_linear(module: torch.nn.Module) -> torch.nn.Module:
    """Swaps every ``nn.Linear`` below ``module`` for an ``EinsumLinear`` on the same
    parameters, and returns ``module``."""
    # A swapped Linear is replaced whole, so nothing below it is visited.
    pending = [module]
    while pending:
        parent = pending.pop()
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear) and not isinstance(child, EinsumLinear):
                setattr(parent, name, _as_einsum_linear(child))
            else:
                pending.append(child)
    return module


def _as_einsum_linear(linear: torch.nn.Linear) -> EinsumLinear:
    # Built on meta, then assign=True adopts the original parameters (no copy, no init).
    with torch.device("meta"):
        einsum = EinsumLinear(linear.in_features, linear.out_features, linear.bias is not None)
    einsum.load_state_dict(linear.state_dict(), strict=True, assign=True)
    return einsum


def apply_backward_optimization_barrier(m: torch.nn.Module) -> None:
    """Puts an optimization barrier on ``m``'s gradients in the backward pass, so the
    compiler cannot fuse its backward with the rest of the graph."""

    def barrier_hook(module: Any, grad_input: Any, grad_output: Any) -> None:
        # Parameters without a gradient yet, and absent input gradients, are None.
        candidates = [*(p.grad for p in module.parameters()), *grad_input]
        xm.optimization_barrier_([g for g in candidates if isinstance(g, torch.Tensor)])

    m.register_full_backward_hook(barrier_hook)


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
    """The kernel of ``xla::aot_mark_sharding``: a sharded copy of ``t``.

    A custom op takes only schema-typed arguments, so the mesh and the spec arrive as the
    text ``str()`` gives for them and are read back here.
    """
    target = Mesh.from_str(mesh)
    assert target is not None
    copy = mark_sharding(t.clone(), target, ast.literal_eval(partition_spec))
    return copy.global_tensor


def _aot_mark_sharding_on_device(_cls: Any, _func: Any, _types: Any, args: Any, kwargs: Any) -> Any:
    return _mark_sharding_from_strings(*args, **kwargs)


_custom_ops.set_mark_sharding_kernel(_mark_sharding_from_strings)
_aot_mark_sharding = _custom_ops.aot_mark_sharding
# The simulator's xla tensors are a Python dispatch subclass: without this rule the op would
# reach its kernel with their CPU values, which cannot hold a sharding.
_aot_mark_sharding.register_torch_dispatch(XlaSimTensor, _aot_mark_sharding_on_device)
