"""The ``xla::`` custom ops that torch_xla's SPMD module registers, defined once per process.

The simulated ``torch_xla`` modules are re-imported for every simulation, but a torch library
op can be defined only once per process, so the definitions live here (in a module imported
once) and the simulated ``xla_sharding`` refers to them.  The op names and schemas are the
ones torch_xla 2.9 registers, since code may call them as ``torch.ops.xla.<name>``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.library import custom_op

from xlasim.runtime.numerics import bilinear
from xlasim.runtime.tensor import XlaSimTensor

aten = torch.ops.aten

# Linear as einsum keeps the batch dims unflattened, so their shardings propagate.
_LINEAR = "...n,mn->...m"
_LINEAR_GRAD_INPUT = "...m,mn->...n"
_LINEAR_GRAD_WEIGHT = "...m,...n->mn"
_LINEAR_GRAD_BIAS = "...m->m"


MarkShardingKernel = Callable[[Tensor, str, str], Tensor]

# What xla::aot_mark_sharding runs: mark_sharding of the simulated torch_xla modules in use,
# which each import of them installs here (the op outlives them, so it cannot import them).
_mark_sharding_kernel: MarkShardingKernel | None = None


def set_mark_sharding_kernel(kernel: MarkShardingKernel) -> None:
    global _mark_sharding_kernel
    _mark_sharding_kernel = kernel


@custom_op("xla::aot_mark_sharding", mutates_args=())
def aot_mark_sharding(t: Tensor, mesh: str, partition_spec: str) -> Tensor:
    # Mesh and spec travel as strings: custom ops take only schema-typed arguments.
    if t is None:
        return None
    if _mark_sharding_kernel is None:
        raise RuntimeError(
            "xla::aot_mark_sharding runs torch_xla.distributed.spmd's mark_sharding; import "
            "torch_xla.distributed.spmd inside the simulation first"
        )
    return _mark_sharding_kernel(t, mesh, partition_spec)


@aot_mark_sharding.register_fake
def _(t: Tensor, mesh: str, partition_spec: str) -> Tensor:
    return None if t is None else torch.empty_like(t)


def _einsum(equation: str) -> Callable[[Tensor, Tensor], Tensor]:
    return lambda a, b: torch.einsum(equation, a, b)


# The einsums multiply at the TPU's mat-mul precision, as the dots torch_xla lowers them to do.
def _linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    out = bilinear(_einsum(_LINEAR), x, weight)
    return out if bias is None else out + bias


def _linear_grads(
    grad_output: Tensor,
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    wants: tuple[bool, bool, bool],
    multiply: Callable[[Callable[[Tensor, Tensor], Tensor], Tensor, Tensor], Tensor] = bilinear,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    # Clones: a custom op may not return a view of (or alias) one of its inputs.
    want_input, want_weight, want_bias = wants
    grad_x = (
        multiply(_einsum(_LINEAR_GRAD_INPUT), grad_output, weight).clone() if want_input else None
    )
    grad_w = multiply(_einsum(_LINEAR_GRAD_WEIGHT), grad_output, x).clone() if want_weight else None
    grad_b = None
    if bias is not None and want_bias:
        grad_b = torch.einsum(_LINEAR_GRAD_BIAS, grad_output).clone()
    return grad_x, grad_w, grad_b


def _shapes_only(product: Callable[[Tensor, Tensor], Tensor], a: Tensor, b: Tensor) -> Tensor:
    # Fake tensors have no values to split: the plain product gives the shape.
    return product(a, b)


@custom_op(
    "xla::einsum_linear_forward",
    schema="(Tensor input, Tensor weight, Tensor? bias) -> Tensor",
    mutates_args=(),
)
def einsum_linear_forward(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return _linear(x, weight, bias)


@einsum_linear_forward.register_fake
def _(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    out = _shapes_only(_einsum(_LINEAR), x, weight)
    return out if bias is None else out + bias


def _linear_backward(
    grad_output: Tensor,
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    want_input: bool,
    want_weight: bool,
    want_bias: bool,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    return _linear_grads(grad_output, x, weight, bias, (want_input, want_weight, want_bias))


einsum_linear_backward = custom_op(
    "xla::einsum_linear_backward",
    _linear_backward,
    schema="(Tensor grad_output, Tensor input, Tensor weight, Tensor? bias, "
    "bool needs_input_grad_input, bool needs_input_grad_weight, bool needs_input_grad_bias) "
    "-> (Tensor, Tensor, Tensor)",
    mutates_args=(),
)


@einsum_linear_backward.register_fake
def _(
    grad_output: Tensor,
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    want_input: bool,
    want_weight: bool,
    want_bias: bool,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    wants = (want_input, want_weight, want_bias)
    return _linear_grads(grad_output, x, weight, bias, wants, multiply=_shapes_only)


# torch_xla's max pooling ops (its C++ autograd ops; torchax lowers the xla:: ops it finds, and
# looks them up starting with this one). Schemas as torch_xla 2.9 registers them.
def _max_pool2d_forward(
    x: Tensor,
    kernel_size: list[int],
    stride: Any = (),
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
) -> Tensor:
    return aten.max_pool2d_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode)[0]


max_pool2d_forward = custom_op(
    "xla::max_pool2d_forward",
    _max_pool2d_forward,
    schema="(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0, "
    "int[2] dilation=1, bool ceil_mode=False) -> Tensor",
    mutates_args=(),
)
max_pool2d_forward.register_fake(_max_pool2d_forward)


def _max_pool2d_backward(
    grad_output: Tensor,
    x: Tensor,
    kernel_size: list[int],
    stride: Any = (),
    padding: Any = 0,
    ceil_mode: bool = False,
) -> Tensor:
    # The schema has no dilation: torch_xla's backward is of an undilated pool.
    dilation = [1, 1]
    _, indices = aten.max_pool2d_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode)
    return aten.max_pool2d_with_indices_backward(
        grad_output, x, kernel_size, stride, padding, dilation, ceil_mode, indices
    )


max_pool2d_backward = custom_op(
    "xla::max_pool2d_backward",
    _max_pool2d_backward,
    schema="(Tensor grad_output, Tensor self, int[2] kernel_size, int[2] stride=[], "
    "int[2] padding=0, bool ceil_mode=False) -> Tensor",
    mutates_args=(),
)
max_pool2d_backward.register_fake(_max_pool2d_backward)


# The ops torch_xla registers for code compiled by dynamo, with torch_xla's schemas (its own
# typo in ``should_donoate`` included: callers may pass it by name).  Their kernel for any
# tensor that is not on the device hands the input back; the simulated tensors' rules are
# installed by the surface (``torch_xla._internal.custom_kernel``).
_XLA_LIB = torch.library.Library("xla", "FRAGMENT")  # noqa: TOR901 - schemas need it
_XLA_LIB.define(
    "dynamo_mark_sharding(Tensor input, int[] device_ids, int[] mesh_shape, str axis_names, "
    "str partition_spec) -> Tensor"
)
_XLA_LIB.define("dynamo_set_buffer_donor_(Tensor t, bool should_donoate) -> Tensor")


def _hand_back(t: Tensor, *_args: object) -> Tensor:
    return t


_XLA_LIB.impl("dynamo_mark_sharding", _hand_back, "CompositeExplicitAutograd")
_XLA_LIB.impl("dynamo_set_buffer_donor_", _hand_back, "CompositeExplicitAutograd")

# What the ops run on simulated device tensors, installed by each import of the surface
# module that defines them.
_device_kernels: dict[str, Callable[..., Tensor]] = {}


def set_device_kernel(op_name: str, kernel: Callable[..., Tensor]) -> None:
    """``kernel`` runs ``xla::<op_name>`` on simulated device tensors from now on."""
    _device_kernels[op_name] = kernel


# The dispatch state a program's own calls run in (taken here: this module is imported once,
# outside any op). A rule is called below autograd, where the simulated device's ops skip
# what it does above it (its TPU rounding of float32 products among it).
_PROGRAM_DISPATCH = (
    torch._C._dispatch_tls_local_include_set(),
    torch._C._dispatch_tls_local_exclude_set(),
)


def _on_device(op_name: str, as_program: bool = False) -> Callable[..., Tensor]:
    """The rule running ``xla::<op_name>`` on simulated device tensors; ``as_program``: its
    kernel is Python code of tensor ops (an attention), run as the program's own calls."""

    def rule(_mode: object, _func: object, _types: object, args: Any, kwargs: Any) -> Tensor:
        kernel = _device_kernels.get(op_name)
        if kernel is None:
            module = "torch_xla.experimental.custom_kernel" if as_program else "torch_xla"
            raise RuntimeError(f"xla::{op_name} needs the simulated torch_xla: import {module}")
        if not as_program:
            return kernel(*args, **kwargs)
        with torch._C._ForceDispatchKeyGuard(*_PROGRAM_DISPATCH):
            return kernel(*args, **kwargs)

    return rule


# The kernels torch_xla's custom_kernel module registers, with its schemas (``casual`` and
# the missing space before ``num_kv_pages_per_block`` are its own). Off the device (dynamo's
# fake tensors) each gives an uninitialised result of the right shape, warning unless the
# tensor named is a meta tensor; on the device it runs the simulated custom_kernel function.
_KERNEL_SCHEMAS = {
    "flash_attention": "flash_attention(Tensor q, Tensor k, Tensor v, bool casual=False) -> Tensor",
    "paged_attention": (
        "paged_attention(Tensor q, Tensor k_pages, Tensor v_pages, Tensor lengths, "
        "Tensor page_indices, int pages_per_compute_block, str? megacore_mode=None, "
        "float? attn_logits_soft_cap=None) -> Tensor"
    ),
    "multi_queries_paged_attention": (
        "multi_queries_paged_attention(Tensor q, Tensor k_pages, Tensor v_pages, "
        "Tensor lengths, Tensor page_indices, Tensor effective_q_lens, "
        "int num_kv_pages_per_compute_block, int num_queries_per_compute_block, "
        "bool use_kernel, float? attn_logits_soft_cap=None) -> Tensor"
    ),
    "ragged_paged_attention": (
        "ragged_paged_attention(Tensor q, Tensor kv_pages, Tensor kv_lens, Tensor page_indices, "
        "Tensor cu_q_lens, Tensor num_seqs, float sm_scale=1, int? sliding_window=None, "
        "float? soft_cap=None, float? mask_value=None, float? k_scale=None, "
        "float? v_scale=None, bool use_kernel=True,int? num_kv_pages_per_block=None, "
        "int? num_queries_per_block=None, int? vmem_limit_bytes=None) -> Tensor"
    ),
    "gmm": (
        "gmm(Tensor lhs, Tensor rhs, Tensor group_sizes, int[]? tiling=None, "
        "Tensor? group_offset=None, bool transpose_rhs=False) -> Tensor"
    ),
    "quantized_matmul_int8": (
        "quantized_matmul_int8(Tensor x, Tensor w, Tensor scalar, Tensor? zero_point=None, "
        "Tensor? quant_block_size=None, bool quantize_activation=False, "
        "int? batch_block_size=None, int? out_block_size=None, int? in_block_size=None) -> Tensor"
    ),
}


def _off_device_warning(checked: Tensor, what: str) -> None:
    if checked.device != torch.device("meta"):
        warnings.warn(f"XLA {what} should only be applied to tensors on XLA device", stacklevel=3)


def _attention_off_device(kind: str) -> Callable[..., Tensor]:
    def shaped_like_q(q: Tensor, checked: Tensor, *_args: object) -> Tensor:
        _off_device_warning(checked, f"{kind} attention")
        return torch.empty_like(q)

    return shaped_like_q


def _gmm_off_device(
    lhs: Tensor, rhs: Tensor, group_sizes: Tensor, tiling: object = None,
    group_offset: object = None, transpose_rhs: bool = False,
) -> Tensor:  # fmt: skip
    _off_device_warning(lhs, "gmm")
    return torch.empty(lhs.shape[0], rhs.shape[1 if transpose_rhs else 2], device=lhs.device)


def _quantized_matmul_int8_off_device(x: Tensor, w: Tensor, *_args: object) -> Tensor:
    _off_device_warning(x, "quantized_matmul_int8")
    return torch.empty(x.shape[0], w.shape[0], device=x.device, dtype=x.dtype)


_OFF_DEVICE: dict[str, Callable[..., Tensor]] = {
    "flash_attention": _attention_off_device("flash"),
    "paged_attention": _attention_off_device("paged"),
    "multi_queries_paged_attention": _attention_off_device("paged"),
    "ragged_paged_attention": _attention_off_device("paged"),
    "gmm": _gmm_off_device,
    "quantized_matmul_int8": _quantized_matmul_int8_off_device,
}
for _name, _schema in _KERNEL_SCHEMAS.items():
    _XLA_LIB.define(_schema)
    _XLA_LIB.impl(_name, _OFF_DEVICE[_name], "CompositeExplicitAutograd")

for _name in ("dynamo_mark_sharding", "dynamo_set_buffer_donor_"):
    # Without a rule the op would reach its kernel with the tensors' CPU values.
    torch.library.register_torch_dispatch(f"xla::{_name}", XlaSimTensor, _on_device(_name))


# --- xla::quantized_matmul (torch_xla.experimental.xla_quantized_matmul) -------------------
# torch_xla defines the op when that module is imported; a library op is defined once per
# process, so it is defined here with torch_xla's schema and the module installs its kernels:
# the host one (CompositeExplicitAutograd: CPU tensors, and fake tensors when dynamo traces)
# and the device one.
_XLA_LIB.define(
    "quantized_matmul(Tensor x, Tensor w, Tensor scale, Tensor? zero_point=None, "
    "int? block_size=-1, bool? int4_weight=False, bool? quantize_activation=False) -> Tensor"
)

_host_kernels: dict[str, Callable[..., Tensor]] = {}


def set_host_kernel(op_name: str, kernel: Callable[..., Tensor]) -> None:
    """``kernel`` runs ``xla::<op_name>`` on tensors that are not simulated device tensors."""
    _host_kernels[op_name] = kernel


def _on_host(op_name: str, module: str) -> Callable[..., Tensor]:
    def run(*args: Any, **kwargs: Any) -> Tensor:
        kernel = _host_kernels.get(op_name)
        if kernel is None:
            raise RuntimeError(f"xla::{op_name} needs the simulated {module}: import it")
        return kernel(*args, **kwargs)

    return run


_XLA_LIB.impl(
    "quantized_matmul",
    _on_host("quantized_matmul", "torch_xla.experimental.xla_quantized_matmul"),
    "CompositeExplicitAutograd",
)


def _device_entry(op_name: str) -> Callable[..., Tensor]:
    host = _on_host(op_name, "torch_xla.experimental.xla_quantized_matmul")

    def run(*args: Any, **kwargs: Any) -> Tensor:
        if not isinstance(args[0], XlaSimTensor):
            # dynamo's fake device tensors: torch_xla computes their shapes with the
            # composite (host) kernel
            return host(*args, **kwargs)
        kernel = _device_kernels.get(op_name)
        if kernel is None:
            raise RuntimeError(
                f"xla::{op_name} needs the simulated torch_xla.experimental.xla_quantized_matmul: "
                "import it"
            )
        return kernel(*args, **kwargs)

    return run


# Device tensors take the kernel at their autograd key, where composite ops (linear, einsum)
# still decompose into the products torch_xla lowers them to, as in the caller's own code;
# below it (a torch_dispatch rule) they would reach the simulated tensors whole.
_XLA_LIB.impl("quantized_matmul", _device_entry("quantized_matmul"), "AutogradXLA")


# The custom_kernel ops take a rule, not a kernel at the autograd key as quantized_matmul
# does: called from a graph dynamo compiled (openxla), such a kernel did not get the
# simulated tensors and returned the off-device result.
for _name in _KERNEL_SCHEMAS:
    _rule = _on_device(_name, as_program=True)
    torch.library.register_torch_dispatch(f"xla::{_name}", XlaSimTensor, _rule)
