"""torch_xla's dynamo bridge on the simulator.

torch's ``openxla`` backend hands :func:`extract_compiled_graph` the AOTAutograd graph of a
``torch.compile``d function with the device tensors of its first call, and then calls what it
returns for every call.  As in torch_xla 2.9, extracting syncs, traces the graph once on the
inputs and compiles the traced program ahead (``CompileTime``, without running it); each call
then syncs inputs that still hold pending IR (``DynamoSyncInputExecuteTime``), traces again
when an input's sharding changed (checked until it has stayed the same
``XLA_DYNAMO_INPUT_SHARDING_CHECK_THRESHOLD`` times in a row, 5 by default), and runs the
compiled program (its execution time only: no cache lookup), which gives fresh device data.

The simulator runs the program by tracing the graph on the call's tensors (their values are
computed as the ops run) and materializing its outputs as the compiled program; a traced
program that is not the compiled one is an error rather than a silent recompile.  A graph
with nodes torch_xla runs on the CPU (an op without a device lowering, or one on CPU
tensors) is split as there: each device part is compiled as a program of its own and the CPU
nodes run between them on every call.  What the simulator does not do raises
NotImplementedError: symbolic shapes or numbers among the inputs (dynamic shapes), and graphs
that update tensors in place.
"""

from __future__ import annotations

import operator
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
import torch_xla
import torch_xla._XLAC as _xlac
import torch_xla.runtime as xr
import torch_xla.utils.utils as xu
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupport
from torch.utils import _pytree as pytree
from torch_xla._dynamo import config
from torch_xla._dynamo.graph_input_matcher import GraphInputMatcher
from torch_xla.experimental import eager_mode_context
from torch_xla.utils.buffer_donor_context import alias_with_buffer_donor_config

from xlasim.runtime import buffer_donation
from xlasim.runtime import state as _state
from xlasim.runtime.tensor import XlaSimTensor, kernels_uncounted

# Names torch_xla's bridge module has too (its tests import them from here).
__all__ = [
    "GraphInputMatcher",
    "UnsupportedNodesCollector",
    "alias_with_buffer_donor_config",
    "extract_compiled_graph",
]

_THRESHOLD = "XLA_DYNAMO_INPUT_SHARDING_CHECK_THRESHOLD"
# Counters the pass looking for CPU fallbacks keeps while it clears the others at each node.
_KEPT_COUNTERS = ("DynamoExtractCompiledGraph", "UncachedCompile")


def extract_compiled_graph(xla_model: torch.fx.GraphModule, xla_args: Any) -> Callable[..., Any]:
    """Compiles ``xla_model`` for inputs like ``xla_args``; returns the function to call."""
    _xlac._xla_increment_counter("DynamoExtractCompiledGraph", 1)
    with eager_mode_context(False):
        return extract_internal(xla_model, tuple(xla_args))


@dataclass
class _Traced:
    """One tracing of the graph: the compiled program and the input shardings it was for."""

    key: int | None
    input_specs: list[str]


def extract_internal(gm: torch.fx.GraphModule, args: tuple[Any, ...]) -> Callable[..., Any]:
    """Syncs the inputs' pending graphs and compiles ``gm`` for ``args``. Named as torch_xla's
    function: PT_XLA_DEBUG tells a sync made here by this name on the stack."""
    _check_inputs(gm, args)
    torch_xla.sync(reset_scope=False)
    _ConstructorsToDevice()(gm.graph)
    gm.recompile()
    on_cpu = _cpu_fallback_nodes(gm, args)
    if on_cpu:
        return _split_around(gm, args, on_cpu)
    # torch_xla partitions every graph (here into one partition) and runs it once more to
    # collect the partition's inputs; what its ops do when run (a buffer donation mark,
    # counted) happens that once more too. The values are dropped.
    gm(*args)
    traced = extract_graph_helper(gm, args)
    remaining_checks = _sharding_check_threshold()

    def optimized_mod(*call_args: Any) -> Any:
        nonlocal traced, remaining_checks
        runtime = _state.current()
        pending = [a for a in call_args if getattr(a, "_node", None) is not None]
        if pending and config.skip_input_data_check:
            # torch_xla runs its compiled program on the inputs' data and has none to run on.
            raise RuntimeError(
                "Check failed: !is_non_data_ir: input data to dynamo graph can not be a "
                "pending ir, please set `torch_xla._dynamo.config.skip_input_data_check` to "
                "False"
            )
        if pending:
            _xlac._xla_increment_counter("DynamoSyncInputExecuteTime", 1)
            _xlac._xla_sync_multi(pending, devices=[], wait=True, sync_xla_data=True)
        if runtime.spmd and remaining_checks > 0:
            # Dynamo's guards do not look at shardings: a changed one needs a new program.
            if _xlac._get_xla_sharding_specs(list(call_args)) != traced.input_specs:
                traced = extract_graph_helper(gm, call_args)
                remaining_checks = _sharding_check_threshold()
            else:
                remaining_checks -= 1
        return _run(gm, call_args, traced, runtime)

    return optimized_mod


def _sharding_check_threshold() -> int:
    return xu.getenv_as(_THRESHOLD, int, 5)


def _check_inputs(gm: torch.fx.GraphModule, args: tuple[Any, ...]) -> None:
    for a in args:
        if not isinstance(a, torch.Tensor):
            raise NotImplementedError(
                f"xlasim's dynamo bridge does not simulate dynamic shapes: the graph takes "
                f"{type(a).__name__} {a!r} (a symbolic size or number); compile with static "
                "shapes (torch.compile's default under torch_xla)"
            )
        if a.device.type != "xla":
            warnings.warn(
                f"Found tensor with shape {a.size()} on {a.device}. Please move all tensors to "
                "xla device to execute on XLA device.",
                stacklevel=3,
            )
    for node in gm.graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op == "call_function" and schema is not None and schema.is_mutable:
            raise NotImplementedError(
                f"xlasim's dynamo bridge does not simulate graphs that update tensors in place "
                f"({node.target}); AOTAutograd's graphs (torch.compile's openxla backend) "
                "apply input mutations outside the graph"
            )


def _ops_run_on_cpu(counters: list[str]) -> list[str]:
    return [name for name in counters if name.startswith("aten::")]


class UnsupportedNodesCollector(torch.fx.Interpreter):
    """Runs the graph once, node by node, as torch_xla does to find the nodes it must run
    on the CPU (an op that fell back to the CPU, or a tensor off the device among a node's
    arguments or results); like torch_xla it clears the counters before each node, keeping
    two."""

    def __init__(self, module: torch.fx.GraphModule) -> None:
        super().__init__(module)
        self._unsupported_nodes: list[torch.fx.Node] = []

    def run_node(self, n: torch.fx.Node) -> Any:
        kept = {name: _xlac._xla_counter_value(name) for name in _KEPT_COUNTERS}
        _xlac._clear_xla_counters()
        result = super().run_node(n)
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        values = pytree.tree_leaves((result, args, kwargs))
        off_device = any(isinstance(v, torch.Tensor) and v.device.type != "xla" for v in values)
        if _ops_run_on_cpu(_xlac._xla_counter_names()) or off_device:
            self._unsupported_nodes.append(n)
        for name, value in kept.items():
            if value:
                _xlac._xla_increment_counter(name, value)
        return result

    def get_unsupported_nodes(self) -> list[torch.fx.Node]:
        return self._unsupported_nodes


def _clone_inputs(args: tuple[Any, ...]) -> None:
    """torch_xla clones the inputs before it traces (to restore ones updated in place); the
    clones are dropped, but cloning data moved from the host under SPMD uploads it
    replicated, which the inputs' sharding specs show from then on."""
    for a in args:
        torch.clone(a)


def _cpu_fallback_nodes(gm: torch.fx.GraphModule, args: tuple[Any, ...]) -> list[torch.fx.Node]:
    _clone_inputs(args)
    finder = UnsupportedNodesCollector(gm)
    finder.run(*args)
    return finder.get_unsupported_nodes()


class _OnDevice(OperatorSupport):
    """The nodes that stay in the device programs: calls other than those found running on
    the CPU (a getitem stays with the call it takes apart)."""

    def __init__(self, on_cpu: list[torch.fx.Node]) -> None:
        super().__init__()
        self.on_cpu = set(on_cpu)

    def is_node_supported(self, submodules: Any, node: torch.fx.Node) -> bool:
        if node.op not in ("call_function", "call_module", "call_method"):
            return False
        return node not in self.on_cpu or node.target is operator.getitem


def _split_around(
    gm: torch.fx.GraphModule, args: tuple[Any, ...], on_cpu: list[torch.fx.Node]
) -> torch.fx.GraphModule:
    """As torch_xla: the graph split into device partitions, each compiled as a program of
    its own, with the CPU nodes between them run as they are on every call."""
    partitioner = CapabilityBasedPartitioner(
        gm, _OnDevice(on_cpu), allows_single_node_partition=True
    )
    position = {node: i for i, node in enumerate(gm.graph.nodes)}
    partitions = partitioner.propose_partitions()
    for partition in partitions:  # proposed in no particular order
        partition.nodes = dict.fromkeys(sorted(partition.nodes, key=position.__getitem__))
    split = partitioner.fuse_partitions(partitions)
    inputs: dict[str, tuple[Any, ...]] = {}

    class _PartitionInputs(torch.fx.Interpreter):
        def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
            if "fused_" in target:
                inputs[target] = tuple(args)
            return super().call_module(target, args, kwargs)

    _PartitionInputs(split).run(*args)
    for node in list(split.graph.nodes):
        if node.op != "call_module" or "fused_" not in node.name:
            continue
        program = extract_internal(getattr(split, node.name), inputs[node.target])
        split.delete_submodule(node.target)
        with split.graph.inserting_after(node):
            call = split.graph.call_function(program, node.args, None)
        node.replace_all_uses_with(call)
        split.graph.erase_node(node)
    split.recompile()
    return split


def extract_graph_helper(gm: torch.fx.GraphModule, args: tuple[Any, ...]) -> _Traced:
    """Syncs, traces the graph on ``args`` and compiles the traced program (not run). Named as
    torch_xla's function: PT_XLA_DEBUG tells dynamo's compilation by this name on the stack."""
    torch_xla.sync(reset_scope=False)
    specs = _xlac._get_xla_sharding_specs(list(args)) if xr.is_spmd() else []
    _clone_inputs(args)
    out = gm(*args)
    _refuse_sharded_outputs(out)
    outputs = _pending_outputs(out)
    del out
    # The traced values are dropped with ``outputs``: torch_xla clears the pending IR.
    return _Traced(_state.current().graphs.warm_up(outputs), specs)


def _refuse_sharded_outputs(out: Any) -> None:
    """An ``XLAShardedTensor`` among the traced values (what ``xla::dynamo_mark_sharding``
    gives back, or an op on it) is no xla tensor to torch_xla's bridge, which fails on it."""
    for value in pytree.tree_leaves(out):
        if (
            isinstance(value, torch.Tensor)
            and not isinstance(value, XlaSimTensor)
            and value.device.type == "xla"
        ):
            name = _SCALAR_TYPE_NAMES.get(value.dtype, str(value.dtype))
            raise RuntimeError(f"Expected XLA tensor. Got: XLA{name}Type")


# torch's scalar type names, as torch_xla's type errors print them.
_SCALAR_TYPE_NAMES = {
    torch.float32: "Float",
    torch.float64: "Double",
    torch.float16: "Half",
    torch.bfloat16: "BFloat16",
    torch.int64: "Long",
    torch.int32: "Int",
    torch.int16: "Short",
    torch.int8: "Char",
    torch.uint8: "Byte",
    torch.bool: "Bool",
}


def _pending_outputs(out: Any) -> list[XlaSimTensor]:
    seen: set[int] = set()
    pending = []
    for value in pytree.tree_leaves(out):
        if isinstance(value, XlaSimTensor) and value._node is not None and id(value) not in seen:
            seen.add(id(value))
            pending.append(value)
    return pending


def _run(gm: torch.fx.GraphModule, args: tuple[Any, ...], traced: _Traced, runtime: Any) -> Any:
    # The compiled program runs as one graph in eager mode too (``ExecuteTime``, not an eager
    # op per node): the ops traced here are its program's, not eager ops.
    with (
        buffer_donation.compiled_program_running(),
        eager_mode_context(False),
        kernels_uncounted(),
    ):
        out = gm(*args)
    outputs = _pending_outputs(out)
    if outputs:
        if traced.key is None:
            raise RuntimeError("the compiled graph was traced without outputs to compute")
        try:
            # torch_xla runs the program through ``_run_cached_graph``, which times taking
            # its inputs' data and wrapping its outputs' (a sample each per run).
            start = time.perf_counter_ns()
            runtime.metrics.add_sample("RunCachedGraphInputData", time.perf_counter_ns() - start)
            runtime.graphs.run_cached(outputs, traced.key, spmd=runtime.spmd)
            runtime.metrics.add_sample("RunCachedGraphOutputData", time.perf_counter_ns() - start)
            # torch_xla compiles the program to alias the inputs marked for donation.
            buffer_donation.run_donating(_state.current(), args)
        except RuntimeError as exc:
            raise NotImplementedError(
                "xlasim's dynamo bridge runs the compiled program only on inputs like those it "
                f"was traced for ({exc}); torch_xla runs the stale program (an input sharding "
                f"changed after {_THRESHOLD} unchanged calls) and fails"
            ) from None
    # A program's outputs are buffers of their own, never views of its inputs' data.
    input_storages = {
        a._elem.untyped_storage().data_ptr() for a in args if isinstance(a, XlaSimTensor)
    }
    for o in outputs:
        if o._elem.untyped_storage().data_ptr() in input_storages:
            o._elem = o._elem.clone()
    return out


def _constructor_mover_base() -> type:
    # Deferred: torch._inductor is heavy, and only a compile needs it.
    from torch._inductor.fx_passes.post_grad import ConstructorMoverPass

    return ConstructorMoverPass


class _ConstructorsToDevice:
    """Makes the graph's CPU tensor constructors (``torch.arange``...) build device tensors
    where their results stay on the device, as torch_xla does before tracing."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        base = _constructor_mover_base()

        class _Mover(base):  # type: ignore[misc,valid-type]
            def allow_cpu_device(self, node: torch.fx.Node) -> bool:
                if super().allow_cpu_device(node):
                    return True
                # A copy to the device (``.to('xla')``) takes the CPU tensor it moves.
                device = node.kwargs.get("device")
                return (
                    node.target == torch.ops.aten._to_copy.default
                    and isinstance(device, torch.device)
                    and device.type == "xla"
                )

        _Mover("xla")(graph)
