"""The parts of torch_xla's C++ extension module that Python code and tests call.

Each function reads or writes the active simulated runtime. Names that are not simulated raise
``AttributeError`` naming them, so ``hasattr`` checks behave and misuse is obvious.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from xlasim.runtime import state as _runtime
from xlasim.runtime import tensor as _tensor


def _rt() -> _runtime.SimRuntime:
    return _runtime.current()


def _xla_get_default_device() -> str:
    return f"xla:{_rt().default_device_index}"


def _xla_set_default_device(device: Any) -> None:
    _rt().default_device_index = torch.device(device).index or 0


def _xla_get_devices() -> list[str]:
    return _rt().xla_devices()


def _xla_real_devices() -> list[str]:
    return _rt().real_devices()


def _xla_get_runtime_devices() -> list[str]:
    return _rt().real_devices()


def _xla_get_all_devices() -> list[str]:
    rt = _rt()
    ids = [0] if rt.spmd else rt.global_device_ids()
    return [f"{rt.device_type}:{i}" for i in ids]


def _xla_get_all_runtime_devices() -> list[str]:
    rt = _rt()
    return [f"{rt.device_type}:{i}" for i in rt.global_device_ids()]


def _xla_num_devices() -> int:
    return len(_rt().xla_devices())


def _xla_num_runtime_devices() -> int:
    return len(_rt().real_devices())


def _xla_get_replication_devices_count() -> int:
    return _rt().replication_devices


def _xla_get_default_device_ordinal() -> int:
    rt = _rt()
    return rt.addressable_device_ids()[0] + rt.default_device_index


def _xla_get_process_index() -> int:
    return _rt().host_index


def _xla_get_num_processes() -> int:
    return _rt().spec.num_hosts


def _xla_device_kind(device: str) -> str:
    return _rt().spec.device_kind


def _xla_get_device_attributes(device: str) -> dict[str, object]:
    index = int(str(device).rpartition(":")[2])
    return _xla_get_all_device_attributes()[index]


def _xla_get_all_device_attributes() -> list[dict[str, object]]:
    from xlasim import sharding as _spmd

    return _spmd.device_attributes(_rt().spec)


def _xla_computation_cache_is_initialized() -> bool:
    return _rt().graphs.initialized


def _xla_get_num_cached_compilation_graph() -> int:
    return len(_rt().graphs.compiled)


def _xla_get_spmd_config_is_locked() -> bool:
    return _rt().devices_used


def _xla_step_marker(
    device: str = "", devices: Any = (), wait: bool = False, reset_scope: bool = True
) -> None:
    rt = _rt()
    graphs = rt.graphs
    graphs.execute(graphs.live_pending(), sync_all=True)
    rt.metrics.inc("MarkStep")


def _xla_sync_multi(
    tensors: list[torch.Tensor], devices: Any = (), wait: bool = True, sync_xla_data: bool = True
) -> None:
    _tensor.materialize([t for t in tensors if isinstance(t, _tensor.XlaSimTensor)])


def _xla_tensors_from_aten(
    tensors: list[torch.Tensor], devices: list[str], shardings: list[Any] | None = None
) -> list[torch.Tensor]:
    """Host-to-device transfers, placing each tensor with its input sharding if given."""
    rt = _rt()
    out: list[torch.Tensor] = []
    for i, (t, device) in enumerate(zip(tensors, devices, strict=True)):
        start = time.perf_counter_ns()
        x = _tensor.wrap_data(t.detach().clone(), torch.device(device))
        rt.metrics.add_sample("TransferToDeviceTime", time.perf_counter_ns() - start)
        sharding = shardings[i] if shardings else None
        from xlasim.runtime import xlac

        # Placement (replicated under SPMD, minibatch assembly across hosts, HBM check).
        x = xlac.place_input(x, sharding)
        out.append(x)
    return out


def _xla_wait_device_ops(devices: Any = ()) -> None:
    """Simulated execution is synchronous: nothing is ever in flight."""


# -- metrics ---------------------------------------------------------------------------
def _xla_counter_names() -> list[str]:
    return _rt().metrics.counter_names()


def _xla_counter_value(name: str) -> int | None:
    return _rt().metrics.counter_value(name)


def _xla_metric_names() -> list[str]:
    return _rt().metrics.metric_names()


def _xla_metric_data(name: str) -> Any:
    return _rt().metrics.metric_data(name)


def _clear_xla_counters() -> None:
    _rt().metrics.clear_counters()


def _clear_xla_metrics() -> None:
    _rt().metrics.clear_metrics()


def _xla_metrics_report() -> str:
    return _rt().metrics.report()


def _short_xla_metrics_report(counter_names: list[str], metric_names: list[str]) -> str:
    return _rt().metrics.report(counter_names, metric_names)


def _get_executed_fallback_ops() -> list[str]:
    return [n for n in _rt().metrics.counter_names() if n.startswith("aten::")]


# -- sharding --------------------------------------------------------------------------
def _xla_set_rng_seed(seed: int, device: str = "") -> None:
    rt = _rt()
    rt.rng_seed = int(seed)
    rt.generator.manual_seed(int(seed))


def _xla_get_rng_seed(device: str = "") -> int:
    return _rt().rng_seed


def __getattr__(name: str) -> Any:
    # The SPMD functions live with the SPMD logic; its __all__ lists what _XLAC exposes.
    from xlasim.runtime import xlac

    if name in xlac.__all__:
        return getattr(xlac, name)
    raise AttributeError(f"xlasim does not simulate torch_xla._XLAC.{name}")
