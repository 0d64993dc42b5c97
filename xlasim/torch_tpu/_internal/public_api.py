"""``torch.tpu`` and its public modules, with TorchTPU 0.2.0's names.

Every public name TorchTPU exports is present: simulated ones answer as on a TPU VM of the
simulated generation, the others raise ``NotImplementedError`` naming themselves when used
(called, or read where TorchTPU exports a property), so a program fails where it needs what
the simulator lacks, never by an attribute silently missing.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch_tpu._internal.device import _device_module
from torch_tpu._internal.distributed import launch_env

_DEVICE = _device_module.TpuDeviceModule

NOT_SIMULATED = "is not simulated by xlasim yet (docs/torch-tpu.md lists what is)"


def not_simulated(qualified: str) -> Callable[..., Any]:
    """A stand-in for a TorchTPU name the simulator does not implement."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{qualified} {NOT_SIMULATED}")

    refuse.__name__ = qualified.rpartition(".")[2]
    refuse.__qualname__ = qualified
    return refuse


# torch.tpu's exports: what each is here, None where it is not simulated.
_TPU: dict[str, Any] = {
    "EagerMode": None,
    "Event": _DEVICE.Event,
    "Precision": _DEVICE.Precision,
    "Stream": _DEVICE.Stream,
    "current_device": _DEVICE.current_device,
    "current_stream": _DEVICE.current_stream,
    "default_stream": _DEVICE.default_stream,
    "device": _device_module._DeviceContext,
    "device_count": _DEVICE.device_count,
    "device_of": _device_module._DeviceOfContext,
    "get_amp_supported_dtype": _DEVICE.get_amp_supported_dtype,
    "get_device_name": _DEVICE.get_device_name,
    "get_device_properties": _DEVICE.get_device_properties,
    "get_rng_state": _DEVICE.get_rng_state,
    "initial_seed": _DEVICE.initial_seed,
    "is_available": _DEVICE.is_available,
    "is_initialized": _DEVICE.is_initialized,
    "manual_seed": _DEVICE.manual_seed,
    "manual_seed_all": _DEVICE.manual_seed_all,
    "precision": _DEVICE.precision,
    "set_device": _DEVICE.set_device,
    "set_eager_mode": None,
    "set_rng_state": _DEVICE.set_rng_state,
    "set_stream": _DEVICE.set_stream,
    "stream": _DEVICE.stream,
    "synchronize": _DEVICE.synchronize,
    "topology_aware_mesh": None,
}
# Exported as properties of their module: reading one is using it.
_TPU_PROPERTIES = ("allow_excess_precision", "eager_mode")
_SUBMODULE_PROPERTIES: Mapping[str, tuple[str, ...]] = {
    "distributed": ("window_num_stripes", "window_stripe_chunk_mb"),
}

# What the simulator implements of the other public modules' exports.
_SUBMODULE_SIMULATED: Mapping[str, Mapping[str, Any]] = {
    "distributed": {"set_tpu_launch_env": launch_env.set_tpu_launch_env},
}

# The other public modules' exports.
_SUBMODULES: Mapping[str, tuple[str, ...]] = {
    "compiler": ("custom_compiler_options",),
    "distributed": (
        "set_tpu_launch_env",
        "spmd_safe",
        "topology_aware_mesh",
        "window_num_stripes",
        "window_stripe_chunk_mb",
    ),
    "ops": (
        "align_jagged_to_multiple",
        "all_gather_dim",
        "max_pool1d",
        "max_pool1d_backward",
        "max_pool2d",
        "max_pool2d_backward",
        "max_pool3d",
        "max_pool3d_backward",
        "optimization_barrier",
        "ragged_all_to_all",
        "ragged_dot",
        "ragged_dot_weight_grad",
        "recv",
        "reduce_scatter_dim",
        "send",
        "sparse_dense_matmul",
        "sparse_dense_matmul_activation_unstack",
        "sparse_dense_matmul_grad_with_adagrad",
        "sparse_dense_matmul_grad_with_adam",
        "sparse_dense_matmul_grad_with_sgd",
        "sparse_dense_matmul_gradient_stack",
        "sparse_gather",
        "sparse_gather_backward",
        "sparse_iota",
        "sparse_map_row",
        "splash_sdpa",
        "strip_jagged_padding",
    ),
    "optimizers": ("AdamW", "Muon", "Optimizer", "Sgd", "SingleTraceTrainer"),
    "pallas": ("get_pallas_mesh", "jax_op"),
    "profiler": ("TpuProfilerConfig",),
}


def _refusing_property(qualified: str) -> property:
    def refuse(self: Any, *value: Any) -> Any:
        raise NotImplementedError(f"{qualified} {NOT_SIMULATED}")

    return property(refuse, refuse)


class _TpuModule(types.ModuleType):
    """``torch.tpu``: its private ``_`` names come from the device module, as TorchTPU's do."""

    __all__: list[str]

    def __getattr__(self, name: str) -> Any:
        if name == "default_generators":
            return _DEVICE._default_generators()
        if name.startswith("_") and not name.startswith("__"):
            try:
                return getattr(_DEVICE, name)
            except AttributeError:
                pass
        raise AttributeError(f"module 'torch.tpu' has no attribute '{name}'")

    def __dir__(self) -> list[str]:
        return sorted(self.__all__)


for _name in _TPU_PROPERTIES:
    setattr(_TpuModule, _name, _refusing_property(f"torch.tpu.{_name}"))


def public_names() -> dict[str, list[str]]:
    """TorchTPU 0.2.0's public names, by module."""
    names = {"torch.tpu": sorted([*_TPU, *_TPU_PROPERTIES, "default_generators"])}
    for leaf, exports in _SUBMODULES.items():
        names[f"torch.tpu.{leaf}"] = sorted(exports)
    return names


def simulated_names() -> dict[str, list[str]]:
    """The public names the simulator implements, by module."""
    implemented = [n for n, v in _TPU.items() if v is not None] + ["default_generators"]
    names = {"torch.tpu": sorted(implemented)}
    for leaf, simulated in _SUBMODULE_SIMULATED.items():
        names[f"torch.tpu.{leaf}"] = sorted(simulated)
    return names


def install() -> None:
    """Puts ``torch.tpu`` and its public modules into ``sys.modules`` and onto ``torch``."""
    tpu = _TpuModule("torch.tpu", "Public TorchTPU device module (`torch.tpu`).")
    for name, value in _TPU.items():
        setattr(tpu, name, value if value is not None else not_simulated(f"torch.tpu.{name}"))
    tpu.__all__ = sorted([*_TPU, *_TPU_PROPERTIES, "default_generators", *_SUBMODULES])
    tpu.__path__ = []  # a package: its public modules import as torch.tpu.<name>
    for leaf, exports in _SUBMODULES.items():
        qualified = f"torch.tpu.{leaf}"
        properties = _SUBMODULE_PROPERTIES.get(leaf, ())
        kind = type(
            f"_{leaf}_module",
            (types.ModuleType,),
            {p: _refusing_property(f"{qualified}.{p}") for p in properties},
        )
        module = kind(qualified, f"Public TorchTPU `{qualified}`.")
        simulated = _SUBMODULE_SIMULATED.get(leaf, {})
        for name in exports:
            if name not in properties:
                setattr(module, name, simulated.get(name) or not_simulated(f"{qualified}.{name}"))
        module.__all__ = sorted(exports)
        sys.modules[qualified] = module
        setattr(tpu, leaf, module)
    sys.modules["torch.tpu"] = tpu
    torch.tpu = tpu  # type: ignore[attr-defined]


def uninstall() -> None:
    """Removes what :func:`install` put in place (a simulation has ended)."""
    for name in [n for n in sys.modules if n == "torch.tpu" or n.startswith("torch.tpu.")]:
        del sys.modules[name]
    if "tpu" in vars(torch):
        delattr(torch, "tpu")
