"""Autocast on the simulated devices: torch_xla 2.9's cast policy on torch's own autocast kernels.

Stock torch has the ``AutocastXLA`` dispatch key but no kernel for it, so ``torch.autocast('xla')``
fails with a raw dispatcher error until torch_xla registers its policy (at ``import torch_xla``).
The simulator registers the same policy while a simulation is active, through torch's C++
autocast wrappers (``ATen/autocast_mode.h``): casting rules, which arguments are eligible
(floating point, on the device, not float64) and the cast cache of leaf weights are then
torch's own, exactly as with torch_xla. The kernels live in the device extension
(:mod:`xlasim.runtime.device`) and are added and removed with a dynamically created
``torch::Library``, so a process that leaves the simulation has stock torch again.

TorchTPU's ``tpu`` device (PyTorch's PrivateUse1, ``AutocastPrivateUse1``) gets the same policy
when a simulated ``torch_tpu`` loads: TorchTPU's own op lists live in its C++ library, not in
its Python sources, so the simulator applies the TPU policy it knows, torch_xla's.

The tables list the ``aten`` overloads torch_xla 2.9 registers for each policy.
"""

from __future__ import annotations

import torch

# Run in the autocast dtype (bfloat16 by default for ``xla``).
LOWER_PRECISION_FP = (
    "addbmm",
    "addmm",
    "baddbmm",
    "bmm",
    "conv1d",
    "conv1d.padding",
    "conv2d",
    "conv2d.padding",
    "conv3d",
    "conv3d.padding",
    "conv_tbc",
    "conv_transpose1d",
    "conv_transpose2d.input",
    "conv_transpose3d.input",
    "einsum",
    "linear",
    "matmul",
    "max_pool2d",
    "mm",
    "prelu",
    "relu",
)

# Run in float32.
FP32 = (
    "_softmax",
    "batch_norm",
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
    "cdist",
    "cholesky",
    "cholesky_inverse",
    "cholesky_solve",
    "cosine_embedding_loss",
    "cross_entropy_loss",
    "ctc_loss.IntList",
    "ctc_loss.Tensor",
    "hinge_embedding_loss",
    "inverse",
    "kl_div",
    "l1_loss",
    "linalg_inv_ex",
    "linalg_svd",
    "log_softmax.Dimname",
    "log_softmax.int",
    "margin_ranking_loss",
    "mse_loss",
    "multi_margin_loss",
    "multilabel_margin_loss",
    "multilabel_margin_loss_forward",
    "nll_loss",
    "nll_loss2d",
    "pow.Tensor_Scalar",
    "prod",
    "prod.dim_Dimname",
    "prod.dim_int",
    "qr",
    "reflection_pad1d",
    "reflection_pad2d",
    "replication_pad1d",
    "replication_pad2d",
    "replication_pad3d",
    "smooth_l1_loss",
    "soft_margin_loss",
    "softmax.Dimname",
    "softmax.int",
    "svd",
    "trace",
    "triangular_solve",
    "triplet_margin_loss",
)

# Run in the widest floating type among the eligible arguments.
PROMOTE = (
    "cat",
    "index_copy",
    "index_copy.dimname",
    "stack",
)

POLICIES = {"lower_precision_fp": LOWER_PRECISION_FP, "fp32": FP32, "promote": PROMOTE}


def _present(overload: str) -> bool:
    """Whether this torch has the overload (newer torch dropped the ``Dimname`` ones)."""
    name, _, variant = overload.partition(".")
    packet = getattr(torch.ops.aten, name, None)
    return packet is not None and (not variant or variant in packet.overloads())


# (name in the extension's ops, torch's DeviceType, the autocast dispatch key) per device.
_DEVICES = {
    "xla": ("XLA", "AutocastXLA"),
    "tpu": ("PrivateUse1", "AutocastPrivateUse1"),
}


def cpp_source() -> str:
    """C++ for ``xlasim::autocast_install_DEVICE()`` and ``autocast_uninstall()`` (ops of the
    extension)."""
    overloads = [
        (policy, ", ".join(overload.split(".")))
        for policy, names in POLICIES.items()
        for overload in names
        if _present(overload)
    ]
    installs = []
    defs = []
    for device, (device_type, key) in _DEVICES.items():
        body = "\n".join(
            f"  KERNEL(c10::DeviceType::{device_type}, {args}, {policy})"
            for policy, args in overloads
        )
        installs.append(f"""
void autocast_install_{device}() {{
  auto& slot = autocast_libraries[c10::DispatchKey::{key}];
  if (slot.first) return;
  // Ops outside the policy pass through the key untouched.
  slot.second = std::make_unique<torch::Library>(
      torch::Library::IMPL, "_", c10::DispatchKey::{key}, __FILE__, __LINE__);
  slot.second->fallback(torch::CppFunction::makeFallthrough());
  slot.first = std::make_unique<torch::Library>(
      torch::Library::IMPL, "aten", c10::DispatchKey::{key}, __FILE__, __LINE__);
  auto& m = *slot.first;
{body}
}}""")
        defs.append(f'  m.def("autocast_install_{device}() -> ()", autocast_install_{device});')
    return f"""
#include <ATen/Operators.h>
#include <ATen/autocast_mode.h>
#include <map>
#include <memory>
#include <utility>

namespace {{
// Per autocast key: (the policy's kernels, the fallthrough for every other op).
std::map<c10::DispatchKey,
         std::pair<std::unique_ptr<torch::Library>, std::unique_ptr<torch::Library>>>
    autocast_libraries;
{"".join(installs)}

void autocast_uninstall() {{
  autocast_libraries.clear();
}}
}}  // namespace

TORCH_LIBRARY_FRAGMENT(xlasim, m) {{
{chr(10).join(defs)}
  m.def("autocast_uninstall() -> ()", autocast_uninstall);
}}
"""


def install(device: str = "xla") -> None:
    """Registers the policy for ``device``'s autocast key (idempotent)."""
    if device not in _DEVICES:
        raise ValueError(f"no autocast policy for device {device!r}: valid {sorted(_DEVICES)}")
    getattr(torch.ops.xlasim, f"autocast_install_{device}")()


def uninstall() -> None:
    """Removes the policy of every device."""
    torch.ops.xlasim.autocast_uninstall()
