"""The ``xla::`` custom ops torch_xla's ``xla_sharding.py`` registers, registered once.

The simulated ``torch_xla`` modules are re-imported for every simulation, but a torch
library op can be defined only once per process, so the definitions live here (in a module
imported once) and the simulated ``xla_sharding`` refers to them.  Bodies are torch_xla's.

PYTEST_DONT_REWRITE: the asserts here are torch_xla's API (their messages are compared
with the real ones), so pytest must not rewrite them.
"""

from __future__ import annotations

import ast

import torch
from torch import Tensor
from torch.library import custom_op


@custom_op("xla::aot_mark_sharding", mutates_args=())
def aot_mark_sharding(t: torch.Tensor, mesh: str, partition_spec: str) -> torch.Tensor:
    if t is None:
        return None

    import torch_xla.distributed.spmd as xs

    the_mesh = xs.Mesh.from_str(mesh)
    assert the_mesh is not None
    partition_spec_eval = ast.literal_eval(partition_spec)
    return xs.mark_sharding(t.clone(), the_mesh, partition_spec_eval).global_tensor


@aot_mark_sharding.register_fake
def _aot_mark_sharding_fake(t: torch.Tensor, mesh: str, partition_spec: str) -> torch.Tensor:
    if t is None:
        return None
    return torch.empty_like(t)


@custom_op(
    "xla::einsum_linear_forward",
    schema="(Tensor input, Tensor weight, Tensor? bias) -> Tensor",
    mutates_args=(),
)
def einsum_linear_forward(input: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:  # noqa: A002
    product = torch.einsum("...n,mn->...m", input, weight)
    if bias is not None:
        return product + bias
    return product


@einsum_linear_forward.register_fake
def _einsum_linear_forward_fake(input: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:  # noqa: A002
    product = torch.einsum("...n,mn->...m", input, weight)
    if bias is not None:
        return product + bias
    return product


def einsum_linear_backward_operation(
    grad_output: Tensor,
    input: Tensor,  # noqa: A002
    weight: Tensor,
    bias: Tensor | None,
    needs_input_grad_input: bool,
    needs_input_grad_weight: bool,
    needs_input_grad_bias: bool,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    grad_input = grad_weight = grad_bias = None
    if needs_input_grad_input:
        grad_input = torch.einsum("...m,mn->...n", grad_output, weight).clone()
    if needs_input_grad_weight:
        grad_weight = torch.einsum("...m,...n->mn", grad_output, input).clone()
    if bias is not None and needs_input_grad_bias:
        grad_bias = torch.einsum("...m->m", grad_output).clone()
    return grad_input, grad_weight, grad_bias


@custom_op(
    "xla::einsum_linear_backward",
    schema="(Tensor grad_output, Tensor input, Tensor weight, Tensor? bias, "
    "bool needs_input_grad_input, bool needs_input_grad_weight, bool needs_input_grad_bias) "
    "-> (Tensor, Tensor, Tensor)",
    mutates_args=(),
)
def einsum_linear_backward(
    grad_output: Tensor,
    input: Tensor,  # noqa: A002
    weight: Tensor,
    bias: Tensor | None,
    needs_input_grad_input: bool,
    needs_input_grad_weight: bool,
    needs_input_grad_bias: bool,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    return einsum_linear_backward_operation(
        grad_output,
        input,
        weight,
        bias,
        needs_input_grad_input,
        needs_input_grad_weight,
        needs_input_grad_bias,
    )


@einsum_linear_backward.register_fake
def _einsum_linear_backward_fake(
    grad_output: Tensor,
    input: Tensor,  # noqa: A002
    weight: Tensor,
    bias: Tensor | None,
    needs_input_grad_input: bool,
    needs_input_grad_weight: bool,
    needs_input_grad_bias: bool,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    return einsum_linear_backward_operation(
        grad_output,
        input,
        weight,
        bias,
        needs_input_grad_input,
        needs_input_grad_weight,
        needs_input_grad_bias,
    )
