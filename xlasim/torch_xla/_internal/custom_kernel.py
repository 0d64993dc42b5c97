"""The simulated device's kernels of the ``xla::`` ops torch_xla registers for dynamo.

The ops themselves are defined once per process (``xlasim.runtime.custom_ops``); each import of
the simulated modules installs what they run on device tensors.
"""

from __future__ import annotations

import ast
from typing import Any

import torch
import torch_xla.distributed.spmd as xs

from xlasim.runtime import buffer_donation, custom_ops
from xlasim.runtime import state as _state


def dynamo_mark_sharding(
    input: torch.Tensor,  # noqa: A002 - the schema's name
    device_ids: list[int],
    mesh_shape: list[int],
    axis_names: str,
    partition_spec: str,
) -> Any:
    """mark_sharding with the mesh and spec given as the values dynamo can put in a graph
    (ids, shape, and the ``str()`` of the axis names and of the spec)."""
    mesh = xs.Mesh(device_ids, tuple(mesh_shape), ast.literal_eval(axis_names))
    return xs.mark_sharding(input, mesh, ast.literal_eval(partition_spec))


def dynamo_set_buffer_donor_(t: torch.Tensor, should_donoate: bool) -> torch.Tensor:
    """Marks ``t``'s buffer for donation (as ``_set_buffer_donation``) and hands ``t`` back."""
    buffer_donation.mark_from_graph(_state.current(), t, should_donoate)
    return t


custom_ops.set_device_kernel("dynamo_mark_sharding", dynamo_mark_sharding)
custom_ops.set_device_kernel("dynamo_set_buffer_donor_", dynamo_set_buffer_donor_)
