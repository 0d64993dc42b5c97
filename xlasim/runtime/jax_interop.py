"""JAX functions on XLA tensors (``xla_builder.call_jax``): JAX jits them on the CPU
(``xlasim.runtime.compiler.jax_call``, which comes with the optional ``tpu-compiler`` extra) and
each call is one user-computation node of the lazy graph. Loaded on first use, as it imports
jax."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import torch

from xlasim.runtime import numerics
from xlasim.runtime.errors import expected_xla_tensor
from xlasim.runtime.settings import tpu_compiler_layer
from xlasim.runtime.state import SimRuntime
from xlasim.runtime.tensor import XlaSimTensor, add_custom_sharding, user_computation
from xlasim.sharding.tensor_sharding import TensorSharding


def layer() -> ModuleType:
    """The JAX-calling layer, or ``NotImplementedError`` naming the extra it needs."""
    return tpu_compiler_layer(
        "xlasim.runtime.compiler.jax_call", "xlasim runs JAX functions on XLA tensors with JAX"
    )


def lower(flat_fn: Callable[[Any], Any], avals: Sequence[tuple[Any, torch.dtype] | None]) -> Any:
    """``flat_fn`` jitted for ``avals`` (a ``jax_call.Lowered``); on a simulated TPU its float32
    matmuls round as the TPU's do (``jax_numerics``), as the simulator's own matmuls do."""
    return layer().Lowered(flat_fn, avals, tpu_matmuls=numerics.level() is not None)


def run(opname: str, inputs: Sequence[torch.Tensor], lowered: Any) -> list[torch.Tensor]:
    """``lowered`` (a ``jax_call.Lowered``) on XLA tensors: one IR node ``opname`` with an output
    per output of the JAX function."""
    tensors: list[XlaSimTensor] = []
    for t in inputs:
        if not isinstance(t, XlaSimTensor):
            raise expected_xla_tensor(t, "")
        if t._manual is not None:
            raise NotImplementedError(
                f"xlasim does not run JAX function {opname} on manually sharded tensors"
            )
        if t._sharding is not None and not t._sharding.is_replicated:
            # torch_xla's partitioner carries the input shardings through the function's HLO;
            # JAX on the CPU computes it whole and would leave every output replicated.
            raise NotImplementedError(
                f"xlasim does not run JAX function {opname} on sharded tensors "
                f"(sharding {t._sharding.op.debug_string()}): the shardings its outputs would "
                "get are not simulated"
            )
        tensors.append(t)
    values = lowered.run([t._elem for t in tensors])
    outs = list(user_computation(tensors, values, opname, lowered.key))
    for out, sharding in zip(outs, lowered.output_shardings, strict=True):
        if sharding is not None:
            # The function's HLO shards this output (libtpu's partitioner chose how).
            spec = TensorSharding(sharding, tuple(out.shape))
            add_custom_sharding(out, "Sharding", spec, tuple(out.shape))
            out._sharding = spec
    return list(outs)


def jax_mesh(rt: SimRuntime, device_ids: Any, axis_names: Sequence[str]) -> Any:
    """``Mesh.get_jax_mesh``: on a simulated TPU the JAX devices are libtpu's descriptions of
    the slice's devices (JAX lowers for them; nothing here runs on them), under
    ``PJRT_DEVICE=CPU`` JAX's CPU devices, as torch_xla's process would see."""
    jax_call = layer()
    tpu_devices = None
    if rt.client.is_tpu:
        libtpu = tpu_compiler_layer(
            "xlasim.runtime.compiler.libtpu", "xlasim describes the slice's devices to JAX"
        )
        tpu_devices = libtpu.topology_devices(rt.spec, rt.num_slices)
    return jax_call.jax_mesh(device_ids, axis_names, tpu_devices)
