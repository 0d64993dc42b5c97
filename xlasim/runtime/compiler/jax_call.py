"""JAX functions called on XLA tensors (``torch_xla.core.xla_builder.call_jax``) run by JAX on
the CPU.

On a TPU, torch_xla lowers the JAX function to HLO once per input shapes and runs that HLO as one
node of the lazy graph. Here the function is jitted by JAX for the same abstract inputs and the
compiled CPU executable computes the node's values, so the results are what JAX computes (on
the CPU: its float rounding, not necessarily a TPU's matrix unit). Part of the optional
TPU-compiler layer (the ``tpu-compiler`` extra): importing this module imports jax.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

# First: jax is imported inside libtpu's load environment, and set up as the rest of the layer
# uses it (CPU platform).
from xlasim.runtime.compiler import libtpu  # noqa: F401

# isort: split
import jax
import ml_dtypes
import numpy as np
import torch
from jax._src import config as jax_config
from jax._src.lib import xla_client

from xlasim.runtime.compiler import jaxpr_rewrite
from xlasim.sharding.op_sharding import OpSharding, ProtoType

# torch dtypes with the numpy/ml_dtypes type JAX names them by (torchax's mapping, which
# torch_xla uses, gives the same JAX dtype for each).
_JAX_DTYPES: dict[torch.dtype, Any] = {
    torch.float64: np.float64,
    torch.float32: np.float32,
    torch.float16: np.float16,
    torch.bfloat16: ml_dtypes.bfloat16,
    torch.int64: np.int64,
    torch.int32: np.int32,
    torch.int16: np.int16,
    torch.int8: np.int8,
    torch.uint8: np.uint8,
    torch.uint16: np.uint16,
    torch.uint32: np.uint32,
    torch.uint64: np.uint64,
    torch.bool: np.bool_,
    torch.complex64: np.complex64,
    torch.complex128: np.complex128,
    torch.float8_e5m2: ml_dtypes.float8_e5m2,
    torch.float8_e4m3fn: ml_dtypes.float8_e4m3fn,
}
_TORCH_DTYPES: dict[Any, torch.dtype] = {np.dtype(v): k for k, v in _JAX_DTYPES.items()}


def jax_module() -> Any:
    """The jax package, for callers outside this layer (``maybe_get_jax``)."""
    return jax


def jax_dtype(dtype: torch.dtype) -> Any:
    """The JAX dtype of a torch dtype (``ValueError`` for one JAX has no match for)."""
    if dtype not in _JAX_DTYPES:
        raise ValueError(f"Unsupported dtype: {dtype}")
    return jax.numpy.dtype(_JAX_DTYPES[dtype])


def torch_dtype(dtype: Any) -> torch.dtype:
    if dtype == jax.dtypes.float0:
        # The tangent type of integer inputs (a jax.vjp's gradient for them): JAX lowers it
        # to a pred constant, which is what torch_xla's node returns.
        return torch.bool
    found = _TORCH_DTYPES.get(np.dtype(dtype))
    if found is None:
        raise NotImplementedError(f"xlasim: a JAX function returned {dtype}, not simulated")
    return found


def jax_mesh(
    device_ids: np.ndarray, axis_names: Sequence[str], tpu_devices: Sequence[Any] | None
) -> Any:
    """A JAX mesh of ``device_ids`` (shaped as the mesh): JAX's device with each id, from
    ``tpu_devices`` (the slice's, in the simulator's id order) or else JAX's CPU devices."""
    if tpu_devices is None:
        by_id = {d.id: d for d in jax.devices("cpu")}
    else:
        for index, device in enumerate(tpu_devices):
            if device.id != index:
                raise NotImplementedError(
                    "xlasim does not simulate JAX meshes of this slice (Mesh.get_jax_mesh): "
                    f"libtpu numbers its device at {tuple(device.coords)} {device.id}, the "
                    f"simulator {index}"
                )
        by_id = dict(enumerate(tpu_devices))
    missing = sorted({int(i) for i in device_ids.flat} - set(by_id))
    if missing:
        raise ValueError(
            f"torch_xla device ID {np.array(missing)} not found in available JAX devices"
        )
    devices = np.empty(device_ids.shape, dtype=object)
    for place, device_id in np.ndenumerate(device_ids):
        devices[place] = by_id[int(device_id)]
    return jax.sharding.Mesh(devices, tuple(axis_names))


def constrain(tensor: Any, mesh: Any, partition_spec: tuple[Any, ...]) -> None:
    """``mark_sharding`` of a torchax tensor (inside a JAX trace): its sharding constraint."""
    tensor.shard_(jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*partition_spec)))


def tree_flatten(tree: Any) -> tuple[list[Any], Any]:
    """JAX's pytree flattening (it knows JAX's own containers, e.g. a ``jax.vjp`` residual)."""
    leaves, spec = jax.tree.flatten(tree)
    return leaves, spec


def tree_unflatten(spec: Any, leaves: Sequence[Any]) -> Any:
    return jax.tree.unflatten(spec, list(leaves))


def trace_context() -> Any:
    """JAX's configuration that changes what a trace produces (x64, matmul precision, ...): a
    function lowered under one is lowered again under another, as ``jax.jit`` does."""
    return jax_config.trace_context()


def _to_jax(value: torch.Tensor) -> jax.Array:
    value = value.detach().contiguous()
    return jax.dlpack.from_dlpack(value)


def _to_torch(array: Any) -> torch.Tensor:
    if array.dtype == jax.dtypes.float0:
        return torch.zeros(array.shape, dtype=torch.bool)
    # dlpack shares JAX's buffer; the copy lets the simulated device own its value.
    return torch.from_dlpack(array).clone()


def _on_cpu(compiled: Any) -> bool:
    shardings = jax.tree.leaves((compiled.input_shardings, compiled.output_shardings))
    return all(d.platform == "cpu" for sharding in shardings for d in sharding.device_set)


def _op_sharding(sharding: Any, ndim: int) -> OpSharding | None:
    """A JAX output sharding as the simulator's (None: replicated), devices by id."""
    hlo = sharding._to_xla_hlo_sharding(ndim)
    if hlo.is_replicated():
        return None
    proto = hlo.to_proto()
    if proto.type != xla_client.OpSharding.Type.OTHER or list(proto.last_tile_dims):
        raise NotImplementedError(
            f"xlasim does not take a JAX function's output sharding {hlo} into the simulation"
        )
    dims = list(proto.tile_assignment_dimensions)
    positions = list(proto.tile_assignment_devices)
    if not positions:  # iota form: positions listed by the reshape/transpose it describes
        iota = np.arange(int(np.prod(dims))).reshape(list(proto.iota_reshape_dims))
        positions = iota.transpose(list(proto.iota_transpose_perm)).reshape(-1).tolist()
    devices = sharding._device_assignment
    return OpSharding.from_fields(
        ProtoType.OTHER,
        dims,
        [devices[p].id for p in positions],
        bool(proto.replicate_on_last_tile_dim),
    )


class Lowered:
    """A flat JAX function jitted for one tuple of abstract inputs, as a user computation:
    ``key`` stands for its lowered module (the same module, the same graph node), ``run``
    computes its outputs from input values (shapes only, for meta inputs), and
    ``output_shardings`` says how each output comes out sharded (None: not sharded).

    A function with shardings over the slice's TPU devices (``Mesh.get_jax_mesh``) is compiled
    by libtpu, whose partitioner gives the output shardings; its values come from the same
    function with those constraints dropped (they change no value), run on the CPU."""

    def __init__(
        self,
        flat_fn: Callable[[Any], Any],
        avals: Sequence[tuple[Any, torch.dtype] | None],
        tpu_matmuls: bool = False,
    ):
        structs = tuple(
            None if aval is None else jax.ShapeDtypeStruct(tuple(aval[0]), jax_dtype(aval[1]))
            for aval in avals
        )
        # Traced once: both lowerings below replay this jaxpr.
        closed, out_shape = jax.make_jaxpr(flat_fn, return_shape=True)(structs)
        out_tree = jax.tree.structure(out_shape)

        def replayed(drop_constraints: bool) -> Callable[[Any], Any]:
            run = jaxpr_rewrite.evaluator(
                closed, tpu_matmuls=tpu_matmuls, drop_constraints=drop_constraints
            )
            return lambda args: jax.tree.unflatten(out_tree, run(jax.tree.leaves(args)))

        # keep_unused: every tensor argument is an input of the node, used or not, as in
        # torch_xla's lowering.
        lowered = jax.jit(replayed(False), keep_unused=True).lower(structs)
        digest = hashlib.sha256(lowered.as_text().encode()).digest()
        self.key = int.from_bytes(digest[:8], "little")
        self._outputs = [(tuple(o.shape), torch_dtype(o.dtype)) for o in lowered.out_info]
        compiled = lowered.compile()
        self.output_shardings: list[OpSharding | None] = [None] * len(self._outputs)
        if not _on_cpu(compiled):
            self.output_shardings = [
                _op_sharding(sharding, len(shape))
                for sharding, (shape, _) in zip(
                    jax.tree.leaves(compiled.output_shardings), self._outputs, strict=True
                )
            ]
            compiled = jax.jit(replayed(True), keep_unused=True).lower(structs).compile()
            if not _on_cpu(compiled):
                raise NotImplementedError(
                    "xlasim does not run this JAX function on the CPU: it stays placed on the "
                    "slice's TPU devices with its sharding constraints dropped"
                )
        self._compiled = compiled

    @property
    def outputs(self) -> list[tuple[tuple[int, ...], torch.dtype]]:
        return list(self._outputs)

    def run(self, values: Sequence[torch.Tensor | None]) -> list[torch.Tensor]:
        if any(v is not None and v.is_meta for v in values):
            # A dry run: shapes only.
            return [torch.empty(s, dtype=d, device="meta") for s, d in self._outputs]
        args = tuple(None if v is None else _to_jax(v) for v in values)
        return [_to_torch(out) for out in self._compiled(args)]
