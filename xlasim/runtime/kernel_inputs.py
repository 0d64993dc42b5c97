"""CPU tensors passed to an op on ``xla`` tensors: accepted or refused as torch_xla 2.9 does.

torch_xla's kernels fetch their tensor arguments in one of three ways, and which one decides
what a CPU tensor among the arguments does:

* copied to the device on the fly (``add``, ``sub``, ``mul``, ``div``'s divisor, indexing,
  batch-norm statistics, and every op without an XLA kernel, which runs on the CPU fallback);
* ``STRICT``: refused with ``Expected XLA tensor. Got: torch.FloatTensor`` (``mm``, ``where``,
  ``gather``, ``mse_loss``, ...);
* ``SCALAR``: generated kernels accept a CPU tensor only when it is a 0-dim scalar (``eq``,
  ``maximum``, ``addcmul``, ...);
* ``LIST``: a list argument whose non-XLA element is reported by index (``cat``).

:data:`KERNEL_INPUTS` lists, per aten overload, the arguments that are not copied on the fly.
It was derived from torch_xla 2.9.0's XLA kernels (``xla_native_functions.yaml``: generated
kernels take every tensor argument as ``SCALAR``, hand-written ones as they fetch it) and spot
checked on real torch_xla (PJRT CPU); only ops with two or more tensor arguments are listed,
since an op reaches the simulator only with at least one ``xla`` tensor.
"""

from __future__ import annotations

from typing import Any

import torch

from xlasim.runtime.errors import aten_type_string, expected_xla_tensor
from xlasim.sharding.messages import torch_xla_error

__all__ = ["KERNEL_INPUTS", "LIST", "SCALAR", "STRICT", "check_cpu_inputs", "rules_for"]

STRICT = "strict"
SCALAR = "scalar"
LIST = "list"

KERNEL_INPUTS: dict[str, dict[str, str]] = {
    "__ilshift__.Tensor": {"other": STRICT, "self": STRICT},
    "__irshift__.Tensor": {"other": STRICT, "self": STRICT},
    "_adaptive_avg_pool2d_backward": {"grad_output": STRICT, "self": STRICT},
    "_adaptive_avg_pool3d_backward": {"grad_output": STRICT, "self": STRICT},
    "_amp_foreach_non_finite_check_and_unscale_": {
        "found_inf": STRICT,
        "inv_scale": STRICT,
        "self": LIST,
    },
    "_amp_update_scale_": {"found_inf": STRICT, "growth_tracker": STRICT},
    "_cdist_forward": {"x1": STRICT, "x2": STRICT},
    "_embedding_bag_forward_only": {
        "indices": STRICT,
        "offsets": STRICT,
        "per_sample_weights": STRICT,
        "weight": STRICT,
    },
    "_log_softmax_backward_data": {"grad_output": STRICT, "output": STRICT},
    "_native_batch_norm_legit": {"input": STRICT, "running_mean": STRICT, "running_var": STRICT},
    "_native_batch_norm_legit.no_stats": {"input": STRICT},
    "_prelu_kernel": {"self": STRICT, "weight": STRICT},
    "_prelu_kernel_backward": {"grad_output": STRICT, "self": STRICT, "weight": STRICT},
    "_propagate_xla_data": {"input": STRICT, "output": STRICT},
    "_softmax_backward_data": {"grad_output": STRICT, "output": STRICT},
    "adaptive_max_pool2d_backward": {"grad_output": STRICT, "self": STRICT},
    "addcdiv": {"self": SCALAR, "tensor1": SCALAR, "tensor2": SCALAR},
    "addcmul": {"self": SCALAR, "tensor1": SCALAR, "tensor2": SCALAR},
    "addmm": {"mat1": STRICT, "mat2": STRICT, "self": STRICT},
    "atan2": {"other": STRICT, "self": STRICT},
    "avg_pool2d_backward": {"grad_output": STRICT, "self": STRICT},
    "avg_pool3d_backward": {"grad_output": STRICT, "self": STRICT},
    "baddbmm": {"batch1": STRICT, "batch2": STRICT, "self": STRICT},
    "bernoulli_.Tensor": {"p": STRICT, "self": STRICT},
    "binary_cross_entropy": {"self": SCALAR, "target": SCALAR},
    "binary_cross_entropy_backward": {"grad_output": SCALAR, "self": SCALAR, "target": SCALAR},
    "bitwise_left_shift.Tensor": {"other": SCALAR, "self": SCALAR},
    "bitwise_right_shift.Tensor": {"other": SCALAR, "self": SCALAR},
    "bmm": {"mat2": STRICT, "self": STRICT},
    "cat": {"tensors": LIST},
    "clamp.Tensor": {"self": SCALAR},
    "clamp_max.Tensor": {"max": SCALAR, "self": SCALAR},
    "clamp_min.Tensor": {"min": SCALAR, "self": SCALAR},
    "convolution_backward_overrideable": {"grad_output": STRICT, "input": STRICT, "weight": STRICT},
    "convolution_overrideable": {"bias": STRICT, "input": STRICT, "weight": STRICT},
    "cross": {"other": STRICT, "self": STRICT},
    "div.Tensor": {"self": STRICT},
    "div.Tensor_mode": {"self": STRICT},
    "dot": {"self": STRICT, "tensor": STRICT},
    "einsum": {"tensors": STRICT},
    "elu_backward": {"grad_output": STRICT, "self_or_result": STRICT},
    "embedding": {"indices": STRICT, "weight": STRICT},
    "embedding_dense_backward": {"grad_output": STRICT, "indices": STRICT},
    "eq.Tensor": {"other": SCALAR, "self": SCALAR},
    "fill_.Tensor": {"self": STRICT},
    "gather": {"index": STRICT, "self": STRICT},
    "ge.Tensor": {"other": SCALAR, "self": SCALAR},
    "gelu_backward": {"self": STRICT},
    "gt.Tensor": {"other": SCALAR, "self": SCALAR},
    "hardshrink_backward": {"grad_out": SCALAR, "self": SCALAR},
    "hardsigmoid_backward": {"grad_output": SCALAR, "self": SCALAR},
    "hardswish_backward": {"grad_output": SCALAR, "self": SCALAR},
    "hardtanh_backward": {"grad_output": STRICT, "self": STRICT},
    "index_add": {"index": STRICT, "self": STRICT, "source": STRICT},
    "index_copy": {"index": STRICT, "self": STRICT, "source": STRICT},
    "index_fill_.int_Scalar": {"index": STRICT, "self": STRICT},
    "index_fill_.int_Tensor": {"index": STRICT, "self": STRICT, "value": STRICT},
    "index_select": {"index": STRICT, "self": STRICT},
    "le.Tensor": {"other": SCALAR, "self": SCALAR},
    "leaky_relu_backward": {"grad_output": STRICT, "self": STRICT},
    "lerp.Scalar": {"end": STRICT, "self": STRICT},
    "lerp.Tensor": {"end": STRICT, "self": STRICT, "weight": STRICT},
    "log_sigmoid_backward": {"buffer": SCALAR, "grad_output": SCALAR, "self": SCALAR},
    "logical_and": {"other": SCALAR, "self": SCALAR},
    "logical_or": {"other": SCALAR, "self": SCALAR},
    "logical_xor": {"other": SCALAR, "self": SCALAR},
    "lt.Tensor": {"other": SCALAR, "self": SCALAR},
    "masked_fill.Scalar": {"mask": SCALAR, "self": SCALAR},
    "masked_fill.Tensor": {"mask": SCALAR, "self": SCALAR, "value": SCALAR},
    "masked_scatter": {"mask": STRICT, "self": STRICT, "source": STRICT},
    "masked_select": {"mask": STRICT, "self": STRICT},
    "max.dim_max": {"self": STRICT},
    "max_pool2d_with_indices_backward": {"grad_output": STRICT, "self": STRICT},
    "max_pool3d_with_indices_backward": {"grad_output": STRICT, "self": STRICT},
    "max_unpool2d": {"indices": STRICT, "self": STRICT},
    "max_unpool3d": {"indices": STRICT, "self": STRICT},
    "maximum": {"other": SCALAR, "self": SCALAR},
    "min.dim_min": {"self": STRICT},
    "minimum": {"other": SCALAR, "self": SCALAR},
    "mm": {"mat2": STRICT, "self": STRICT},
    "mse_loss": {"self": STRICT, "target": STRICT},
    "mse_loss_backward": {"grad_output": STRICT, "self": STRICT, "target": STRICT},
    "mv": {"self": STRICT, "vec": STRICT},
    "mv.out": {"self": STRICT, "vec": STRICT},
    "native_batch_norm": {"input": STRICT},
    "native_batch_norm_backward": {"grad_out": STRICT, "input": STRICT},
    "native_dropout_backward": {"grad_output": SCALAR, "mask": SCALAR},
    "native_layer_norm": {"bias": STRICT, "weight": STRICT},
    "ne.Tensor": {"other": SCALAR, "self": SCALAR},
    "nll_loss2d_backward": {"grad_output": STRICT, "self": STRICT, "target": STRICT},
    "nll_loss2d_forward": {"self": STRICT, "target": STRICT},
    "nll_loss_backward": {"grad_output": STRICT, "self": STRICT, "target": STRICT},
    "nll_loss_forward": {"self": STRICT, "target": STRICT},
    "normal.Tensor_Tensor": {"mean": STRICT, "std": STRICT},
    "put_": {"index": STRICT, "self": STRICT, "source": STRICT},
    "reflection_pad1d_backward": {"grad_output": STRICT, "self": STRICT},
    "reflection_pad2d_backward": {"grad_output": STRICT, "self": STRICT},
    "reflection_pad3d_backward": {"grad_output": STRICT, "self": STRICT},
    "remainder.Tensor": {"other": STRICT, "self": STRICT},
    "replication_pad1d_backward": {"grad_output": STRICT, "self": STRICT},
    "replication_pad2d_backward": {"grad_output": STRICT, "self": STRICT},
    "replication_pad3d_backward": {"grad_output": STRICT, "self": STRICT},
    "rrelu_with_noise": {"noise": STRICT, "self": STRICT},
    "rrelu_with_noise_backward": {"grad_output": STRICT, "noise": STRICT, "self": STRICT},
    "scatter_reduce.two": {"index": STRICT, "self": STRICT, "src": STRICT},
    "set_.source_Tensor": {"source": STRICT},
    "sigmoid_backward": {"grad_output": STRICT, "output": STRICT},
    "silu_backward": {"grad_output": SCALAR, "self": SCALAR},
    "smooth_l1_loss": {"self": STRICT, "target": STRICT},
    "smooth_l1_loss_backward": {"grad_output": STRICT, "self": STRICT, "target": STRICT},
    "softplus_backward": {"grad_output": STRICT, "self": STRICT},
    "softshrink_backward": {"grad_output": SCALAR, "self": SCALAR},
    "stack": {"tensors": STRICT},
    "take": {"index": SCALAR, "self": SCALAR},
    "tanh_backward": {"grad_output": STRICT, "output": STRICT},
    "threshold_backward": {"grad_output": STRICT, "self": STRICT},
    "triangular_solve": {"A": STRICT},
    "where.self": {"condition": STRICT, "other": STRICT, "self": STRICT},
    "xlogy.Tensor": {"other": STRICT, "self": STRICT},
}

Rule = tuple[int, str, str]
"""(position in the schema, argument name, STRICT / SCALAR / LIST)."""


def rules_for(op: Any) -> tuple[Rule, ...] | None:
    """The arguments of ``op`` (an ``OpOverload``) that must not be CPU tensors, or None."""
    schema = op._schema
    name = schema.name.partition("::")[2]
    overload = schema.overload_name
    kinds = KERNEL_INPUTS.get(f"{name}.{overload}" if overload else name)
    if kinds is None:
        return None
    return tuple(
        (i, a.name, kinds[a.name]) for i, a in enumerate(schema.arguments) if a.name in kinds
    )


def _hint(op: Any, name: str, t: torch.Tensor) -> str:
    return (
        f"argument {name!r} of {op._schema.name} is a {t.device.type} tensor of shape "
        f"{list(t.shape)}; move it to the device first, e.g. t.to(torch_xla.device())"
    )


def check_cpu_inputs(
    op: Any, rules: tuple[Rule, ...], args: tuple[Any, ...], kwargs: dict[str, Any], xla: type
) -> None:
    """Raises torch_xla's error when a refused argument of ``op`` is not an ``xla`` tensor."""
    for position, name, kind in rules:
        value = args[position] if position < len(args) else kwargs.get(name)
        if value is None or type(value) is xla:
            continue
        if isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                if not isinstance(item, torch.Tensor) or type(item) is xla:
                    continue
                hint = _hint(op, f"{name}[{index}]", item)
                if kind == LIST:
                    raise torch_xla_error(
                        RuntimeError,
                        "Expected all tensors in the given list to be XLA tensors. Element "
                        f"at index {index} is not an XLA tensor. Got: {aten_type_string(item)}",
                        hint,
                    )
                raise expected_xla_tensor(item, hint)
        elif isinstance(value, torch.Tensor) and not (kind == SCALAR and value.dim() == 0):
            raise expected_xla_tensor(value, _hint(op, name, value))
