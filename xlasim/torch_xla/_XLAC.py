"""The parts of torch_xla's C++ extension module that Python code and tests call.

Each function reads or writes the active simulated runtime. Names that are not simulated raise
``AttributeError`` naming them, so ``hasattr`` checks behave and misuse is obvious.

The SPMD functions mirror the pybind bindings of the same name in torch_xla 2.9
(``init_python_bindings.cpp`` / ``xla_sharding_util.cpp``): the same checks, in the same
order, failing with the same ``Check failed: <condition>: <message>`` RuntimeErrors.  The
sharding arithmetic is ``xlasim.sharding``; moving shard data is ``xlasim.runtime.shards``.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from typing import Any

import torch

from xlasim.runtime import (
    buffer_donation,
    graph_inputs,
    graph_limit,
    ir_scopes,
    ir_text,
    manual,
    numerics,
    op_builder,
    optimizer_steps,
    pallas,
    state,
)
from xlasim.runtime.compiler.hlo_text import tensors_hlo
from xlasim.runtime.debug_info import tensor_debug_info
from xlasim.runtime.errors import aten_type_string, expected_xla_tensor
from xlasim.runtime.graph import CompileError, CustomCall
from xlasim.runtime.memory import reserve, reshard, sent_bytes, settle
from xlasim.runtime.ready_callbacks import on_ready
from xlasim.runtime.settings import xla_env_flag
from xlasim.runtime.shards import (
    assemble_from_hosts,
    gather_shards,
    global_value,
    place_input,
    place_shards,
)
from xlasim.runtime.tensor import (
    XlaSimTensor,
    add_custom_sharding,
    add_optimization_barrier,
    clear_pending,
    ir_hash,
    leaf_input,
    mark_uploaded,
    materialize,
    note_write,
    replace_values,
    user_computation,
    wrap_data,
)
from xlasim.runtime.unsimulated import UnsimulatedAttribute
from xlasim.sharding import op_sharding
from xlasim.sharding.op_sharding import (
    ProtoType,
    check_failed,
    padded_shard,
    replica_and_indices,
    shard_shape,
)
from xlasim.sharding.tensor_sharding import TensorSharding


def _rt() -> state.SimRuntime:
    return state.current()


def _init_computation_client() -> None:
    """Starts the runtime's client (torch_xla takes the TPU before JAX could)."""
    _rt().start()


def _xla_get_default_device() -> str:
    rt = _rt()
    rt.start()  # naming a device starts the runtime, as in torch_xla
    return f"xla:{rt.default_device_index}"


def _xla_set_default_device(device: Any) -> None:
    rt = _rt()
    rt.start()
    rt.default_device_index = torch.device(device).index or 0


def _xla_get_devices() -> list[str]:
    return _rt().xla_devices()


def _xla_real_devices(devices: list[str] | None = None) -> list[str]:
    """The runtime devices (``CPU:0``, ``TPU:3``) behind ``xla:N`` devices (default: all)."""
    rt = _rt()
    if devices is None:
        return rt.real_devices()
    return [rt.xla_devices()[_ordinal(str(d))] for d in devices]


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


def _xla_set_replication_devices(devices: list[str]) -> None:
    _rt().replication_devices = len(devices)


def _set_all_reduce_token(device: str, token: Any) -> None:
    """The simulator orders collectives by program order; it keeps no token to reset."""


def _xla_get_default_device_ordinal() -> int:
    return _rt().default_ordinal()


def _xla_get_process_index() -> int:
    return _rt().client.process_index


def _xla_get_num_processes() -> int:
    return _rt().client.num_processes


def _xla_device_kind(device: str) -> str:
    return _rt().client.device_kind


def _xla_get_device_attributes(device: str) -> dict[str, object]:
    """The PJRT device's own attributes: ``TPU:N`` is the slice's device N, this process's
    ``xla:N`` its N-th addressable one; the device's name is not among them (the global list
    adds it)."""
    kind, _, number = str(device).rpartition(":")
    global_id = int(number)
    if kind.lower() == "xla":
        global_id = _rt().addressable_device_ids()[global_id]
    attributes = dict(_xla_get_all_device_attributes()[global_id])
    attributes.pop("name", None)
    return attributes


def _xla_get_all_device_attributes() -> list[dict[str, object]]:
    return _rt().client.attributes()


def _xla_runtime_is_initialized() -> bool:
    return _rt().client_initialized


def _xla_computation_cache_is_initialized() -> bool:
    return _rt().graphs.initialized


def _xla_get_num_cached_compilation_graph() -> int:
    return len(_rt().graphs.compiled)


def _xla_get_spmd_config_is_locked() -> bool:
    return _rt().devices_used


def _xla_step_marker(
    device: str = "", devices: Any = (), wait: bool = False, reset_scope: bool = True
) -> None:
    try:
        _rt().mark_step()
    except CompileError as exc:
        # torch_xla turns a failed XLA compile into std::invalid_argument, which pybind11
        # raises as ValueError (the aten ops that materialize raise it as RuntimeError).
        raise ValueError(str(exc)) from None
    if reset_scope:  # after the step ran, as torch_xla's MarkStep does
        ir_scopes.reset()


def _set_use_eager_mode(use_eager_mode: bool) -> None:
    _rt().graphs.use_eager_mode = bool(use_eager_mode)


def _get_use_eager_mode() -> bool:
    return _rt().graphs.use_eager_mode


def _set_allow_execution(allow_execution: bool) -> None:
    _rt().graphs.allow_execution = bool(allow_execution)


def _get_allow_execution() -> bool:
    return _rt().graphs.allow_execution


def _set_current_graph_name(name: str) -> None:
    _rt().graphs.graph_name = str(name)


def _get_current_graph_name() -> str:
    return _rt().graphs.graph_name


def _xla_sync_multi(
    tensors: list[torch.Tensor], devices: Any = (), wait: bool = True, sync_xla_data: bool = True
) -> None:
    # ``sync_xla_data`` makes it a step barrier for aliasing: in-place updates donate.
    materialize(
        [t for t in tensors if isinstance(t, XlaSimTensor)],
        ValueError,
        donate_ltc=bool(sync_xla_data),
    )


def _xla_tensors_from_aten(
    tensors: list[torch.Tensor], devices: list[str], shardings: list[Any] | None = None
) -> list[torch.Tensor]:
    """Host-to-device transfers, placing each tensor with its input sharding if given."""
    rt = _rt()
    out: list[torch.Tensor] = []
    start = time.perf_counter_ns()
    for i, (t, device) in enumerate(zip(tensors, devices, strict=True)):
        sharding = shardings[i] if shardings else None
        # A sharded transfer is placed (and its buffer counted) by place_input only.
        x = wrap_data(t.detach().clone(), torch.device(device), allocate=sharding is None)
        if t.requires_grad:  # torch_xla's transfer keeps the flag (measured on 2.9 CPU)
            x.requires_grad_(True)
        # Placement (replicated under SPMD, minibatch assembly across hosts, HBM check).
        x = place_input(x, sharding)
        out.append(x)
    if out:  # the whole list is one transfer
        rt.metrics.to_device(sum(sent_bytes(rt, x) for x in out), start)
    for placed in out:
        mark_uploaded(placed, rt)
    return out


def _xla_wait_device_ops(devices: Any = ()) -> None:
    """Simulated execution is synchronous: nothing is ever in flight."""


# The fused updates of torch_xla.amp.syncfree's optimizers.
_xla_adam_optimizer_step_ = optimizer_steps.adam_step
_xla_sgd_optimizer_step_ = optimizer_steps.sgd_step


# -- build and tensor facts ----------------------------------------------------------------
# The commits torch_xla 2.9.0 was built from: the v2.9.0 tag's, and the torch it pins.
_XLA_GIT_REV = "5fab7053df86c8d503b98d9e7202ca8b8d4978c7"


def _get_git_revs() -> dict[str, str]:
    return {"xla": _XLA_GIT_REV, "torch": torch.version.git_version}


def _get_xla_tensor_shape_type(t: torch.Tensor) -> str:
    """The XLA element type of a tensor's value (``f16``...)."""
    if not isinstance(t, XlaSimTensor):
        raise expected_xla_tensor(t, "")
    return op_builder.xla_type(t.dtype)


def _get_xla_tensor_dimension_size(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Size ``dim`` of ``t`` as an s32 XLA scalar: a dynamic dimension's real size."""
    if not isinstance(t, XlaSimTensor):
        raise expected_xla_tensor(t, "")
    return torch.tensor(int(t.shape[dim]), dtype=torch.int32, device=t.device)


def _unsafe_buffer_pointer(t: torch.Tensor) -> int:
    """The address of the memory holding the tensor's computed value (the simulated device
    buffer lives in host memory)."""
    if not isinstance(t, XlaSimTensor):
        raise expected_xla_tensor(t, "")
    materialize([t])
    return 0 if t._elem.is_meta else t._elem.data_ptr()


# -- Python-built XLA computations (torch_xla.core.xla_builder) ----------------------------
_xla_op_create_builder = op_builder.create_builder
_xla_op_param = op_builder.parameter
_xla_op_create = op_builder.create_op
_xla_op_shape = op_builder.op_shape
_xla_op_build = op_builder.build


def _xla_op_builder(op: op_builder.XlaOp) -> op_builder.XlaBuilder:
    return op.builder


def _xla_op_tensor_shape(tensor: torch.Tensor, device: str = "") -> Any:
    """The XLA shape of a tensor as a builder parameter takes it."""
    return op_builder.shape_of(tensor)


def _xla_user_computation(
    opname: str, inputs: Sequence[torch.Tensor], computation: op_builder.XlaComputation
) -> list[torch.Tensor]:
    """Runs a built computation on XLA tensors: one IR node ``opname`` with an output per
    element of the computation's result (its root, or each element of a root tuple)."""
    tensors: list[XlaSimTensor] = []
    for t in inputs:
        if not isinstance(t, XlaSimTensor):
            raise expected_xla_tensor(t, "")
        tensors.append(t)
        if t._manual is not None:
            raise NotImplementedError(
                f"xlasim does not run user computation {opname} on manually sharded tensors"
            )
    result = op_builder.evaluate(computation, [t._elem for t in tensors])
    values = [v.contiguous() for v in op_builder.flatten(result)]
    return list(user_computation(tensors, values, opname, computation.fingerprint))


def _xla_tpu_custom_call(
    inputs: Sequence[torch.Tensor],
    payload: str,
    output_shapes: Sequence[Sequence[int]],
    output_dtypes: Sequence[torch.dtype],
) -> list[torch.Tensor]:
    """A Pallas kernel traced by ``trace_pallas`` on XLA tensors: one ``xla::tpu_custom_call``
    IR node with an output per declared (shape, dtype), computed in JAX's TPU interpret mode."""
    if not inputs:
        raise RuntimeError("Check failed: inputs.size() > 0: inputs are empty")
    tensors: list[XlaSimTensor] = []
    for t in inputs:
        if not isinstance(t, XlaSimTensor):
            raise expected_xla_tensor(t, "")
        if t._manual is not None:
            raise NotImplementedError(
                "xlasim does not run a Pallas kernel on manually sharded tensors"
            )
        tensors.append(t)
    values = pallas.interpreter().run(
        payload, [t._elem for t in tensors], output_shapes, output_dtypes
    )
    key = int.from_bytes(hashlib.sha256(payload.encode()).digest()[:8], "little")
    return list(user_computation(tensors, values, "xla::tpu_custom_call", key))


def _xla_computation_text(computation: op_builder.XlaComputation) -> str:
    raise NotImplementedError(
        "xlasim does not write HLO text for computations built with xla_builder "
        f"({computation.name})"
    )


def _xla_op_computation_from_module_proto(name: str, proto: Any) -> Any:
    raise NotImplementedError(
        "xlasim does not load XLA computations from HloModuleProto bytes "
        "(xla_builder.computation_from_module_proto)"
    )


# -- metrics ---------------------------------------------------------------------------
def _xla_counter_names() -> list[str]:
    return _rt().metrics.counter_names()


def _xla_counter_value(name: str) -> int | None:
    return _rt().metrics.counter_value(name)


def _xla_increment_counter(name: str, value: int) -> None:
    """Adds ``value`` to a counter, creating it if new (a count: never negative)."""
    if not isinstance(name, str) or not isinstance(value, int) or value < 0:
        raise TypeError(
            "_xla_increment_counter(): incompatible function arguments. The following argument "
            "types are supported:\n    1. (arg0: str, arg1: typing.SupportsInt) -> None\n\n"
            f"Invoked with: {name!r}, {value!r}"
        )
    _rt().metrics.inc(name, value)


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
    return _rt().metrics.fallback_ops()


# -- numerics --------------------------------------------------------------------------------
def _xla_set_mat_mul_precision(*args: Any, **kwargs: Any) -> None:
    """XLA's ``StringToPrecision``: any case of a level's name; one string, positionally."""
    if len(args) != 1 or kwargs or not isinstance(args[0], str):
        given = ", ".join([*map(repr, args), *(f"kwargs: {k}={v!r}" for k, v in kwargs.items())])
        raise TypeError(
            "_xla_set_mat_mul_precision(): incompatible function arguments. The following "
            f"argument types are supported:\n    1. (arg0: str) -> None\n\nInvoked with: {given}"
        )
    level = args[0].lower()
    if level not in numerics.PRECISIONS:
        raise RuntimeError("Unknown precision")
    numerics.set_precision(_rt(), level)


def _xla_get_mat_mul_precision() -> str:
    return _rt().mat_mul_precision


def _checked_xla_device(device: str) -> None:
    """torch_xla's checks of a device string naming an ``xla`` device of this process."""
    if not device:
        return
    parsed = torch.device(device)  # torch's own error for a string naming no device type
    if parsed.type != "xla":
        raise RuntimeError(f"Check failed: device.type() == at::kXLA ({parsed.type} vs. xla)")
    count = len(_rt().xla_devices())
    if parsed.index is not None and parsed.index >= count:
        raise IndexError(
            f"vector::_M_range_check: __n (which is {parsed.index}) >= this->size() "
            f"(which is {count})"
        )


def _xla_set_enable_alias_with_buffer_donor_config(
    enable_user_config_alias: Any = False, device: str = ""
) -> None:
    # pybind11's bool argument: None and numbers convert, anything else does not.
    if enable_user_config_alias is not None and not isinstance(
        enable_user_config_alias, (bool, int, float)
    ):
        raise TypeError(
            "_xla_set_enable_alias_with_buffer_donor_config(): incompatible function "
            "arguments. The following argument types are supported:\n    1. "
            "(enable_user_config_alias: bool = False, device: str = '') -> None\n\n"
            f"Invoked with: {enable_user_config_alias!r}"
        )
    _checked_xla_device(device)
    _rt().graphs.donors.user_config = bool(enable_user_config_alias)


def _xla_get_enable_alias_with_buffer_donor_config(device: str = "") -> bool:
    _checked_xla_device(device)
    return _rt().graphs.donors.user_config


def _set_buffer_donation(tensor: Any, should_donate: bool) -> bool:
    """Marks the tensor's device data for donation to the next graph that reads it (see
    ``runtime.donation``); False, changing nothing, for a pending op's result."""
    return buffer_donation.set_donation(_rt(), xla_tensor(tensor), should_donate)


def _get_buffer_donation(tensor: Any) -> bool:
    t = xla_tensor(tensor)
    return t._node is None and _rt().graphs.donors.is_marked(leaf_input(t))


def _is_placecholder(tensor: Any) -> bool:
    """Whether the tensor's device buffer was donated away (torch_xla's spelling)."""
    t = xla_tensor(tensor)
    return t._node is None and _rt().graphs.donors.deleted_on(leaf_input(t)) is not None


def _xla_set_rng_seed(seed: int, device: str = "") -> None:
    _rt().manual_seed(seed)


def _xla_get_rng_seed(device: str = "") -> int:
    return _rt().rng_seed


# torch_xla's id for the RNG seed's device data among a graph's inputs (a constant of its C++
# side: -127389 on torch_xla 2.9).
_SEED_INFO_ID = -127389


def _get_seed_info_id() -> int:
    return _SEED_INFO_ID


def _get_base_seed_as_tensor(device: str) -> torch.Tensor:
    """The device's base RNG seed as an int64 scalar on the device: the seed last set, moved
    on by each step barrier (and in eager mode by each random op); within a lazy step it is
    not the running seed ``xm.get_rng_state()`` reads (torch_xla 2.9). Its 64 bits are read
    as a signed number."""
    if not device:
        raise RuntimeError("Device string must not be empty")
    base = _rt().rng_base
    return torch.tensor(base - 2**64 if base >= 2**63 else base, dtype=torch.int64, device=device)


def _init_xla_lazy_backend() -> None:
    """Registers torch_xla's kernels with PyTorch; they were registered when torch_xla was
    imported, and torch_xla does it once per process, so this changes nothing (nor the
    ``RegisterXLAFunctions`` counter)."""


def _get_xla_tensors_text(tensors: Sequence[Any]) -> str:
    rt = _rt()
    return ir_text.tensors_text([xla_tensor(t) for t in tensors], rt.float_storage, rt.long_storage)


def _clear_pending_irs(device: str) -> None:
    """Drops the pending IR of every live tensor on ``device`` without running it; those
    tensors are left as device data with no data behind them (torch_xla 2.9)."""
    rt = _rt()
    target = torch.device(device) if device else None
    for t in rt.graphs.live_pending():
        if target is None or t.device == target:
            clear_pending(t)
    rt.graphs.pending = [
        ref for ref in rt.graphs.pending if (t := ref()) is not None and t._node is not None
    ]


def _xla_get_tensor_id(t: Any) -> int:
    return graph_inputs.tensor_id(xla_tensor(t))


def _get_tensors_xla_device_data_node(tensors: Sequence[Any]) -> tuple[list[int], list[Any]]:
    """(ids, tensors) of the device data the tensors' graph reads; each returned tensor is a
    new one on the same data, as torch_xla's."""
    return graph_inputs.listed_inputs([xla_tensor(t) for t in tensors])


def _xla_warm_up_cache(tensors: Sequence[Any], devices: Sequence[str]) -> None:
    """Compiles the graph of the pending tensors without running it (kept by graph hash)."""
    xs = [xla_tensor(t) for t in tensors]
    graph_inputs.warm_up(_rt(), xs, _get_graph_hash(xs))


def _run_cached_graph(graph_hash: bytes, graph_inputs_: Sequence[Any]) -> list[Any]:
    return graph_inputs.run_traced(_rt(), graph_hash, list(graph_inputs_))


def _get_tensors_handle(tensors: Sequence[Any]) -> list[int]:
    """An opaque number per tensor naming its device buffer (aliases share it)."""
    handles = []
    for t in map(xla_tensor, tensors):
        if t._buf is None:
            raise NotImplementedError(
                "xlasim does not simulate the handle of a tensor without device data of its "
                "own (pending IR, or data still on the host)"
            )
        handles.append(id(t._buf))
    return handles


def _check_tensor_need_materialization(tensors: Sequence[Any]) -> list[bool]:
    """For each tensor, whether it holds pending IR rather than data (a CPU tensor: False)."""
    return [isinstance(t, XlaSimTensor) and t._node is not None for t in tensors]


# -- SPMD ------------------------------------------------------------------------------------
class OpSharding(op_sharding.OpSharding):
    """``torch_xla._XLAC.OpSharding(tile_assignment, group_assignment, replication_groups,
    sharding_type)``; each one made counts as ``CreateOpSharding``, as in torch_xla."""

    __slots__ = ()

    def _on_create(self) -> None:
        state.count("CreateOpSharding")


def xla_tensor(t: Any) -> Any:
    """``bridge::GetXlaTensor``: the simulated device tensor, or the real error."""
    if isinstance(t, XlaSimTensor):
        return t
    global_tensor = getattr(t, "global_tensor", None)  # XLAShardedTensor wraps one
    if isinstance(global_tensor, XlaSimTensor):
        return global_tensor
    if isinstance(t, torch.Tensor):
        raise expected_xla_tensor(
            t,
            f"a {t.device.type} tensor (shape {list(t.shape)}) was given where torch_xla "
            f"needs a tensor on the xla device; move it there first, e.g. "
            f"t = t.to(torch_xla.device())",
        )
    raise RuntimeError(f"Expected XLA tensor. Got: {type(t).__name__}")


def _is_pending_ir(x: Any) -> bool:
    return getattr(x, "_node", None) is not None


def _require_spmd() -> state.SimRuntime:
    rt = state.current()
    if not rt.spmd:
        raise check_failed(
            "UseVirtualDevice()", "Please enable SPMD via `torch_xla.runtime.use_spmd()`"
        )
    return rt


def _device_name(rt: state.SimRuntime, ordinal: int) -> str:
    return f"{rt.device_type}:{ordinal}"


def _ordinal(device: str) -> int:
    _, _, index = device.rpartition(":")
    return int(index)


# -- annotation ------------------------------------------------------------------------------
def _xla_mark_sharding(t: Any, sharding: OpSharding) -> None:
    """``ShardingUtil::XlaMarkSharding``."""
    state.count("XlaMarkSharding")
    rt = _require_spmd()
    if sharding.proto_type == ProtoType.UNKNOWN:
        raise check_failed(
            "sharding.type() != xla::OpSharding::UNKNOWN",
            "Can't explicilty annotate with UNKNOWN sharding type.",
        )
    x = xla_tensor(t)
    new = TensorSharding(sharding, x.shape)
    if _is_pending_ir(x):
        # Not device data: torch_xla attaches a custom-sharding IR node instead of moving data.
        _annotate_custom(x, new)
        return
    current = x._sharding
    if current is not None:
        if current.same_as(new):
            return
        if not current.is_replicated:
            raise check_failed(
                "false", "Existing annotation must be cleared first: " + current.op.debug_string()
            )
    elif x._buf is not None and _tiled(x._buf.key[2]):
        # clear_sharding left the data in its shards: torch_xla gathers them before resharding.
        rt.metrics.inc("ReplicateShardedData")
    # Fits (or fails like PJRT) before the data moves.
    reshard(rt, x, new)
    start = time.perf_counter_ns()
    if rt.client.num_processes > 1:
        # The transfer takes each device's shard from the host that owns the device.
        replace_values(x, assemble_from_hosts(rt, global_value(x), new))
    state.count("VirtualDeviceUsage")
    _set_sharding(x, new)
    # The data moves to the devices as one buffer per addressable device.
    rt.metrics.inc("CreateDataHandles", len(rt.addressable_device_ids()))
    rt.metrics.to_device(sent_bytes(rt, x), start)
    mark_uploaded(x, rt)


def _tiled(sharding: TensorSharding | None) -> bool:
    return sharding is not None and not sharding.is_replicated


def _set_sharding(x: Any, sharding: TensorSharding) -> None:
    state.count("SetShardingSpec")
    x._sharding = sharding


def _annotate_custom(x: Any, new: TensorSharding) -> None:
    state.count("XlaAnnotateCustomSharding")
    if not _is_pending_ir(x):
        # Over data the node's debug text is not known (see debug_info).
        x._computed, x._uploaded_at = False, None
    add_custom_sharding(x, "Sharding", new, tuple(x.shape))
    _set_sharding(x, new)


def _xla_annotate_custom_sharding(t: Any, sharding: OpSharding) -> None:
    """``ShardingUtil::XlaAnnotateCustomSharding``."""
    x = xla_tensor(t)
    _require_spmd()
    if sharding.proto_type == ProtoType.UNKNOWN:
        raise check_failed(
            "sharding.type() != xla::OpSharding::UNKNOWN",
            "Can't explicilty annotate with UNKNOWN sharding type.",
        )
    _annotate_custom(x, TensorSharding(sharding, x.shape))


def _mark_manual_sharding(t: Any, sharding: OpSharding) -> None:
    x = xla_tensor(t)
    if not _is_pending_ir(x):
        raise check_failed(
            "IsNonDeviceDataIR(input)", "Marking any data tensors as manual is not supported"
        )
    _xla_mark_sharding(x, sharding)


def _xla_optimization_barrier_(tensors: Sequence[Any]) -> None:
    """``tensor_methods::optimization_barrier_``: one IR node over the tensors' values."""
    add_optimization_barrier([xla_tensor(t) for t in tensors])


def _xla_get_auto_sharding() -> bool:
    """``ShardingUtil::GetAutoSharding``: auto-sharding is never on in the simulator, which
    does not simulate it; ``XLA_AUTO_SPMD`` would switch it on in torch_xla."""
    if xla_env_flag("XLA_AUTO_SPMD"):
        raise NotImplementedError(
            "xlasim does not simulate auto-sharding (XLA_AUTO_SPMD is set: "
            "torch_xla._XLAC._xla_get_auto_sharding)"
        )
    return False


def _xla_clear_sharding(t: Any) -> None:
    x = xla_tensor(t)
    x._sharding = None
    if x._node is not None and isinstance(x._node.args, CustomCall):
        x._node.args.spec = None  # torch_xla clears the sharding of the tensor's IR node too
        x._node.sharding = None


# -- queries ---------------------------------------------------------------------------------
def _get_graph_hash(tensors: Sequence[Any]) -> bytes:
    """The hash of the graph that computes ``tensors``: 16 bytes, as torch_xla's. Equal for
    graphs torch_xla would compile once (a sharding, shape, dtype or op change changes it);
    the bytes themselves are the simulator's own."""
    xs = [xla_tensor(t) for t in tensors]
    key = repr(tuple(ir_hash(x) for x in xs)).encode()
    if _rt().graphs.donors.user_config:
        # A program compiled to alias the donated inputs is another program.
        key += repr(graph_inputs.donated_positions(xs)).encode()
    return hashlib.blake2b(key, digest_size=16).digest()


def _get_xla_sharding_spec(t: Any) -> str:
    sharding = xla_tensor(t)._sharding
    return sharding.spec_string() if sharding is not None else ""


def _get_xla_sharding_specs(tensors: Sequence[Any]) -> list[str]:
    return [_get_xla_sharding_spec(t) for t in tensors]


def _get_xla_op_sharding(t: Any) -> OpSharding | None:
    sharding = xla_tensor(t)._sharding
    return sharding.op if sharding is not None else None


def _get_xla_sharding_type(t: Any) -> int | None:
    sharding = xla_tensor(t)._sharding
    return sharding.sharding_type() if sharding is not None else None


# -- shards ----------------------------------------------------------------------------------
def _sharded(x: Any, message: str = "Tensor is not sharded") -> TensorSharding:
    sharding = x._sharding
    if sharding is None:
        raise check_failed("xtensor->sharding_spec() != nullptr", message)
    return sharding


def _local_shardings(
    tensors: Sequence[Any],
) -> tuple[state.SimRuntime, list[int], list[tuple[Any, TensorSharding]]]:
    """(runtime, this host's device ordinals, each device tensor with its sharding)."""
    rt = state.current()
    return rt, rt.addressable_device_ids(), [(x, _sharded(x)) for x in map(xla_tensor, tensors)]


def _get_local_shards(tensors: Sequence[Any]) -> list[list[tuple[torch.Tensor, str]]]:
    rt, local, sharded = _local_shardings(tensors)
    out = []
    for x, sharding in sharded:
        value = global_value(x)
        start = time.perf_counter_ns()
        padded = sharding.shard_shape()
        pieces = []
        for _replica, indices in replica_and_indices(sharding.op, tuple(x.shape), local):
            pieces.append(padded_shard(value, indices, padded))
        rt.metrics.add_sample("TransferFromDeviceTime", time.perf_counter_ns() - start)
        out.append([(p, _device_name(rt, d)) for p, d in zip(pieces, local, strict=True)])
    return out


def _get_local_shard_replica_and_indices(tensors: Sequence[Any]) -> list[list[tuple[int, Any]]]:
    _, local, sharded = _local_shardings(tensors)
    return [replica_and_indices(s.op, tuple(x.shape), local) for x, s in sharded]


def _shape_text(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


def _check_shard_shapes(
    shards: Sequence[torch.Tensor], padded: Sequence[int], condition: str
) -> None:
    for shard in shards:
        if list(shard.shape) != list(padded):
            raise check_failed(
                condition,
                f"Input shard shape must include padding: {_shape_text(shard.shape)} vs "
                f"{_shape_text(padded)}",
            )


def _load_local_shards(t: Any, shards: Sequence[torch.Tensor], devices: Sequence[str]) -> None:
    x = xla_tensor(t)
    sharding = _sharded(x, "Cannot load local shards into a non sharded tensor")
    rt = state.current()
    local = rt.addressable_device_ids()
    if len(devices) != len(local):
        raise check_failed(
            "devices.size() == client->GetLocalDevices().size()",
            "Shards must be provided for all local devices",
        )
    if sharding.op.proto_type == ProtoType.REPLICATED:
        raise check_failed(
            "sharding.type() != xla::OpSharding::REPLICATED",
            "Replicated tensor should not be loaded from _load_local_shards - use copy_",
        )
    _check_shard_shapes(shards, sharding.shard_shape(), "shard.sizes() == shard_shape")
    value = global_value(x).clone()
    ordinals = [_ordinal(d) for d in devices]
    shards, ordinals = gather_shards(rt, shards, ordinals)
    place_shards(value, sharding, shards, ordinals)
    # Written into the data in place: every alias of the tensor (a state_dict's detached
    # entries and the parameters they came from) sees the loaded shards, as in torch_xla.
    note_write(x)
    x._elem.detach().copy_(value)
    x._node = None
    x._computed, x._uploaded_at = False, None  # debug text of loaded shards: not known
    settle(rt, x)


def _global_tensor_from_cpu_shards(
    shards: Sequence[torch.Tensor],
    sharding: OpSharding,
    global_shape: Sequence[int] | None = None,
) -> Any:
    rt = _require_spmd()
    local = rt.addressable_device_ids()
    if len(local) != len(shards):
        raise check_failed(
            "local_devices.size() == shards.size()", "Must specify a shard for each local device"
        )
    if global_shape is not None and len(global_shape) != shards[0].dim():
        raise check_failed(
            "!global_shape.has_value() || global_shape.value().size() == shards[0].sizes().size()",
            f"Global shape rank must agree with shard rank: expected rank {shards[0].dim()}, "
            f"got {len(global_shape)}",
        )
    if global_shape is None:
        if sharding.proto_type == ProtoType.OTHER:
            dims = sharding.tile_assignment_dimensions
            global_shape = [dims[d] * shards[0].shape[d] for d in range(shards[0].dim())]
        elif sharding.proto_type == ProtoType.REPLICATED:
            global_shape = list(shards[0].shape)
        else:
            raise check_failed("false", f"Unsupported OpSharding type: {int(sharding.proto_type)}")
    spec = TensorSharding(sharding, global_shape)
    expected = shard_shape(sharding, spec.shape)
    _check_shard_shapes(shards, expected, "shard.sizes() == expected_shard_shape")
    reserve(rt, spec.shape, shards[0].dtype, rt.default_device_index, spec)
    value = torch.zeros(spec.shape, dtype=shards[0].dtype)
    if spec.op.proto_type == ProtoType.REPLICATED:
        value.copy_(shards[0])  # each host reads back its own replica
    else:
        all_shards, ordinals = gather_shards(rt, shards, local)
        place_shards(value, spec, all_shards, ordinals)
    out = wrap_data(value, None, spec)
    if shards[0].requires_grad:
        out.requires_grad_(True)
    return out


# -- manual sharding ---------------------------------------------------------------------------
def _manual_spec(x: Any) -> TensorSharding:
    return TensorSharding(OpSharding([], [], [], ProtoType.MANUAL), x.shape)


def _spmd_full_to_shard_shape(t: Any) -> Any:
    x = xla_tensor(t)
    sharding = x._sharding
    if sharding is None:
        raise check_failed("sharding_spec != nullptr", "Input tensor is not sharded")
    out = manual.full_to_shard(_rt(), x, sharding)
    out._sharding = _manual_spec(out)
    return out


def _spmd_shard_to_full_shape(
    t: Any, sharding: OpSharding, output_shape: Sequence[int], output_dtype: Any
) -> Any:
    x = xla_tensor(t)
    current = x._sharding
    if current is None or current.op.proto_type != ProtoType.MANUAL:
        raise check_failed(
            "sharding_spec != nullptr && sharding_spec->sharding.type() == xla::OpSharding::MANUAL",
            "Input tensor is not manual sharded",
        )
    out, spec = manual.shard_to_full(_rt(), x, sharding, list(output_shape), output_dtype)
    out._sharding = spec
    return out


def _xla_spmd_all_reduce(
    reduce_type: str, input: Any, scale: float, groups: list[list[int]]
) -> Any:
    x = xla_tensor(input)
    out = manual.collective(_rt(), x, reduce_type, scale, groups)
    out._sharding = _manual_spec(out)
    return out


def _xla_spmd_reduce_scatter(
    reduce_type: str,
    input: Any,
    scale: float,
    scatter_dim: int,
    shard_count: int,
    groups: list[list[int]],
) -> Any:
    x = xla_tensor(input)
    out = manual.collective(_rt(), x, reduce_type, scale, groups, (scatter_dim, shard_count))
    out._sharding = _manual_spec(out)
    return out


# -- input sharding (parallel loader) ----------------------------------------------------------
class XlaShardingSpec(TensorSharding):
    """``torch_xla._XLAC.XlaShardingSpec(tensor, tile_assignment, group_assignment,
    replication_groups, sharding_type, minibatch)``: an OpSharding bound to a global shape.

    With ``minibatch`` the tensor is this host's part of the batch and the global batch
    dimension is ``local * global_devices / local_devices``.
    """

    __slots__ = ()

    def __init__(
        self,
        tensor: torch.Tensor,
        tile_assignment: list[Any],
        group_assignment: list[Any],
        replication_groups: list[Any],
        sharding_type: int,
        minibatch: bool,
    ) -> None:
        shape = list(tensor.shape)
        if minibatch:
            rt = state.current()
            num_local = len(rt.addressable_device_ids())
            num_global = len(rt.global_device_ids())
            if len(tile_assignment) != num_global:
                raise check_failed(
                    "tile_assignment.size() == num_global_devices",
                    "Minibatch sharding only supports sharding along the batch dimension",
                )
            shape[0] = shape[0] * num_global // num_local
        op = OpSharding(tile_assignment, group_assignment, replication_groups, sharding_type)
        super().__init__(op, shape, minibatch)


def _get_xla_tensors_hlo(tensors: Sequence[Any]) -> str:
    return tensors_hlo(_rt(), [xla_tensor(t) for t in tensors])


def _get_xla_tensor_debug_info(t: Any) -> str:
    if isinstance(t, torch.Tensor) and t.device.type != "xla":
        return "Not a XLATensor\n"  # torch_xla 2.9's answer for a tensor of another device
    return tensor_debug_info(_rt(), xla_tensor(t))


def _on_ready_callback(tensor: torch.Tensor, callback: Any) -> None:
    if not isinstance(tensor, XlaSimTensor):
        raise expected_xla_tensor(tensor, "")
    on_ready(_rt(), tensor, callback)


def _ensure_xla_coordinator_initialized(
    global_rank: int, world_size: int, master_addr: str, master_port: str = "8547"
) -> None:
    # The simulated processes meet through xlasim's own host link, not a coordination
    # service at master_addr:master_port, so the address is not used.
    _rt().coordinator.ensure_initialized(int(global_rank), int(world_size))


def _activate_preemption_sync_manager() -> None:
    rt = _rt()
    rt.coordinator.activate_preemption_sync(processes_share_slice=rt.single_process)


def _deactivate_preemption_sync_manager() -> None:
    _rt().coordinator.deactivate_preemption_sync()


def _sync_point_reached(step: int) -> bool:
    return _rt().coordinator.sync_point_reached(int(step))


def _dot_general_operand(t: Any, position: str) -> XlaSimTensor:
    if isinstance(t, XlaSimTensor):
        return t
    raise RuntimeError(
        f"Expected input tensor ({position} argument) to be an actual XLA tensor. "
        f"Got: {aten_type_string(t)}. Consider moving it ({position} argument) to XLA."
    )


def _xla_dot_general(
    lhs: Any,
    rhs: Any,
    dim_vectors: Any,
    preferred_element_type: torch.dtype | None = None,
) -> torch.Tensor:
    """XLA's DotGeneral: ``dim_vectors`` is ``((lhs_contracting, rhs_contracting),
    (lhs_batch, rhs_batch))`` (the batch pair may be empty); the result's dimensions are the
    batch ones, then lhs's free ones, then rhs's, in ``preferred_element_type`` when given
    (XLA accumulates int8 operands into it). Computed as a batched matmul of the operands
    permuted to (batch, free, contracting) and (batch, contracting, free)."""
    lhs = _dot_general_operand(lhs, "first")
    rhs = _dot_general_operand(rhs, "second")
    contracting = dim_vectors[0]
    batch = dim_vectors[1] if len(dim_vectors) > 1 and dim_vectors[1] else ([], [])
    lc = [d % lhs.dim() for d in contracting[0]]
    rc = [d % rhs.dim() for d in contracting[1]]
    lb = [d % lhs.dim() for d in batch[0]]
    rb = [d % rhs.dim() for d in batch[1]]
    lf = [d for d in range(lhs.dim()) if d not in lc and d not in lb]
    rf = [d for d in range(rhs.dim()) if d not in rc and d not in rb]
    out_dtype = preferred_element_type or torch.promote_types(lhs.dtype, rhs.dtype)
    # integer products accumulate in the output type (an int8 matmul would wrap around)
    work = out_dtype if not out_dtype.is_floating_point else None
    a, b = (lhs.to(work), rhs.to(work)) if work is not None else (lhs, rhs)

    def size(t: torch.Tensor, dims: list[int]) -> int:
        n = 1
        for d in dims:
            n *= t.shape[d]
        return n

    a = a.permute(*lb, *lf, *lc).reshape(size(lhs, lb), size(lhs, lf), size(lhs, lc))
    b = b.permute(*rb, *rc, *rf).reshape(size(rhs, rb), size(rhs, rc), size(rhs, rf))
    shape = [lhs.shape[d] for d in lb] + [lhs.shape[d] for d in lf] + [rhs.shape[d] for d in rf]
    return torch.bmm(a, b).reshape(shape).to(out_dtype)


def _xla_cast_int4(weight: Any, int4_values: Sequence[int]) -> torch.Tensor:
    """``weight`` reinterpreted as int4: torch_xla makes an s4 constant of ``int4_values``
    (``weight``'s values, flattened) and hands it back as an int8 tensor of ``weight``'s
    shape. The simulated device keeps the values in int8, which holds every int4 value."""
    t = xla_tensor(weight)
    values = [int(v) for v in int4_values]
    if any(v < -8 or v > 7 for v in values):
        raise NotImplementedError(
            "xlasim does not simulate _xla_cast_int4 of values outside int4's range [-8, 7]"
        )
    host = torch.tensor(values, dtype=torch.int8).reshape(t.shape)
    return host.to(t.device)


def _dynamic_shape_detector_start_session(session_id: str) -> None:
    graph_limit.start_session(session_id)


def _dynamic_shape_detector_end_session() -> None:
    graph_limit.end_session()


def _dynamic_shape_detector_remove_session(session_id: str) -> None:
    graph_limit.remove_session(session_id)


def _dynamic_shape_detector_set_max_different_graphs(max_different_graphs: int) -> None:
    graph_limit.set_max_different_graphs(max_different_graphs)


def _dynamic_shape_detector_get_max_different_graphs() -> int:
    return graph_limit.max_different_graphs()


def __getattr__(name: str) -> Any:
    raise UnsimulatedAttribute(f"xlasim does not simulate torch_xla._XLAC.{name}")
