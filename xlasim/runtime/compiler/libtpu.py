"""The real TPU compiler (libtpu, through jax's ahead-of-time API) for a simulated slice.

A graph the simulator counts as an uncached compile is replayed into a functional core-ATen
graph (``torch.fx`` with torch's own decompositions, on fake tensors: no values), lowered to jax
(``aten_to_jax``) and compiled by libtpu for the slice's topology with the tensors' shardings.
No TPU chip is needed: libtpu compiles for a topology it is told about.  What comes back is
the compiler's own per-device accounting (``memory_analysis``/``cost_analysis``) and the
sharding it chose for every output; numerical results still come from the simulator.

Optional: needs the ``tpu-compiler`` extra (jax[tpu], which brings libtpu; libtpu is under
Google Cloud terms, so it is never vendored).  Only a simulation that asks for the compiler
imports this module, so ``import xlasim`` never imports jax.

Device order: libtpu's topology lists devices by chip coordinates, and the simulator's device
ids follow the same coordinates (see ``sharding.device_layout``); devices are matched by
coordinates and core, never by libtpu's ``device.id`` (which numbers chips row-major over the
whole grid).  Shardings are handed over as GSPMD ``OpSharding`` protos over that device list,
the representation torch_xla itself compiles with, so any tile assignment carries over as is.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch._decomp import core_aten_decompositions
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from tpu_backend.topology import SliceSpec
from xlasim.runtime import dry_run
from xlasim.runtime.graph import CompiledGraph, CompileError, InputRef, Node, RecordedCall
from xlasim.runtime.settings import REPORT_ENV
from xlasim.sharding.device_layout import device_attributes
from xlasim.sharding.op_sharding import OpSharding, ProtoType

# libtpu reads these when it loads: a topology without chips, no metadata server, logs in a
# directory of ours.  Set only while it loads (a user's own values win), so that the
# simulated program and its child processes never see a TPU environment they did not set.
_LIBTPU_LOAD_ENV = {
    "TPU_SKIP_MDS_QUERY": "1",
    "TPU_WORKER_HOSTNAMES": "localhost",
    # Any valid type: without one libtpu logs host-bound errors (the figures do not change).
    "TPU_ACCELERATOR_TYPE": "v5litepod-16",
    # libtpu otherwise takes /tmp/libtpu_lockfile: a second process (pytest-xdist, simulated
    # hosts, Ray workers) fails with "ABORTED: Internal error when accessing libtpu multi-process
    # lockfile". Compiling needs no chip, so processes can share it.
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
}
_LOG_DIR_ENV = "TPU_LOG_DIR"


@contextlib.contextmanager
def _libtpu_load_env(log_dir: str) -> Iterator[None]:
    wanted = {**_LIBTPU_LOAD_ENV, _LOG_DIR_ENV: log_dir}
    added = [name for name in wanted if name not in os.environ]
    for name in added:
        os.environ[name] = wanted[name]
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def _private_log_dir() -> str:
    """libtpu writes a log per process; ours go to a directory removed at exit (libtpu's
    default, ``$TMPDIR/tpu_logs``, would keep every process's logs forever)."""
    given = os.environ.get(_LOG_DIR_ENV)
    if given:
        return given
    path = tempfile.mkdtemp(prefix="xlasim-libtpu-logs-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


LOG_DIR = _private_log_dir()

with _libtpu_load_env(LOG_DIR):
    import jax
    from jax._src import config as jax_config
    from jax._src.lib import xla_client  # the GSPMD sharding proto
    from jax._src.sharding_impls import GSPMDSharding
    from jax.experimental import topologies

from xlasim.runtime.compiler import aten_to_jax  # noqa: E402 - imports jax, after its environment

# Compiling only: jax itself computes nothing here and must not look for accelerators.
jax.config.update("jax_platforms", "cpu")
# torch_xla 2.9 partitions with GSPMD, and GSPMD shardings take any device order; Shardy (jax's
# default) would need one mesh for all inputs.
jax.config.update("jax_use_shardy_partitioner", False)


@contextlib.contextmanager
def wide_integers() -> Iterator[None]:
    """jax with 64-bit types, for what this layer traces and lowers: torch_xla keeps int64
    tensors as s64 on a TPU (XLA_USE_32BIT_LONG is off by default), where jax would narrow them
    to int32 (with a warning per op) and under-count their bytes. Scoped to the calling thread
    (jax's thread-local setting), not set for the process: JAX code of the program itself
    (Pallas kernels, JAX references) runs with jax's defaults, as on a TPU VM."""
    previous = jax_config.enable_x64.swap_local(True)
    try:
        yield
    finally:
        jax_config.enable_x64.set_local(previous)


aten = torch.ops.aten

# -- topology ----------------------------------------------------------------------------------
# libtpu's topology names per generation, and the options that make one device per chip where
# torch_xla has one (v4 is megacore in torch_xla; libtpu lists its two cores unless asked).
_TOPOLOGY_NAMES: dict[str, tuple[str, dict[str, Any]]] = {
    "v2": ("v2", {}),
    "v3": ("v3", {}),
    "v4": ("v4", {"chip_config_name": "megacore"}),
    "v5litepod": ("v5e", {}),
    "v5p": ("v5p", {}),
    "v6e": ("v6e", {}),
    "v7x": ("tpu7x", {}),
}

_topologies: dict[tuple[str, tuple[int, ...], int], list[Any]] = {}

# Peak dense bf16 FLOP/s and HBM bytes/s of one chip, from the Google Cloud TPU pages' "key
# specifications" tables: v2 45 TFLOPS, 600 GBps (/tpu/docs/v2); v3 123 TFLOPS, 900 GBps (/v3);
# v4 275 TFLOPS, 1200 GBps (/v4); v5e 197 TFLOPS, 819 GBps (/v5e); v5p 459 TFLOPS, 2765 GBps
# (/v5p); v6e 918 TFLOPS, 1638 GBps (/v6e); TPU7x 2307 TFLOPS, 7380 GBps (/tpu7x).  Used only
# for the roofline step-time estimate, so they live here and not in the backend's slice table.
_CHIP_PEAKS = {
    "v2": (45e12, 600e9),
    "v3": (123e12, 900e9),
    "v4": (275e12, 1200e9),
    "v5litepod": (197e12, 819e9),
    "v5p": (459e12, 2765e9),
    "v6e": (918e12, 1638e9),
    "v7x": (2307e12, 7380e9),
}


def topology_devices(spec: SliceSpec, num_slices: int = 1) -> list[Any]:
    """libtpu's devices for ``num_slices`` slices of ``spec``, in the simulator's device-id
    order (slice by slice, as torch_xla numbers a multislice job's devices)."""
    key = (spec.accelerator, spec.dims, num_slices)
    cached = _topologies.get(key)
    if cached is not None:
        return cached
    name, options = _TOPOLOGY_NAMES[spec.accelerator]
    shape = "x".join(str(d) for d in spec.dims)
    if num_slices > 1:
        # libtpu lays out a multislice topology itself: each device carries its slice_index.
        options = {**options, "num_slices": num_slices}
    with _libtpu_load_env(LOG_DIR):
        devices = topologies.get_topology_desc(f"{name}:{shape}", "tpu", **options).devices
    by_place = {(getattr(d, "slice_index", 0), tuple(d.coords), d.core_on_chip): d for d in devices}
    ordered = []
    for slice_index in range(num_slices):
        for attrs in device_attributes(spec):
            place = (slice_index, tuple(attrs["coords"]), attrs["core_on_chip"])
            if place not in by_place or len(devices) != spec.num_devices * num_slices:
                raise NotImplementedError(
                    f"libtpu's {name}:{shape} topology x {num_slices} slice(s) ({len(devices)} "
                    f"devices) does not match the simulated job ({spec.num_devices} devices per "
                    f"slice): no device at (slice, coords, core) {place}"
                )
            ordered.append(by_place[place])
    _topologies[key] = ordered
    return ordered


def jax_sharding(sharding: OpSharding | None, devices: Sequence[Any]) -> Any:
    """The GSPMD sharding torch_xla would compile with; ``None`` (unannotated) is replicated."""
    proto = xla_client.OpSharding()
    if sharding is None or sharding.proto_type in (ProtoType.REPLICATED, ProtoType.UNKNOWN):
        proto.type = xla_client.OpSharding.Type.REPLICATED
    elif sharding.proto_type == ProtoType.OTHER:
        proto.type = xla_client.OpSharding.Type.OTHER
        proto.tile_assignment_dimensions = list(sharding.tile_assignment_dimensions)
        proto.tile_assignment_devices = list(sharding.tile_assignment_devices)
        proto.replicate_on_last_tile_dim = sharding.replicate_on_last_tile_dim
    else:
        raise NotImplementedError(
            f"the TPU compiler layer does not pass {sharding.proto_type.name} shardings to libtpu"
        )
    return GSPMDSharding(devices, proto)


def op_sharding(sharding: Any) -> OpSharding:
    """The simulator's OpSharding for a sharding XLA chose (over the same device list)."""
    hlo = getattr(sharding, "_hlo_sharding", None)
    if hlo is None or hlo.is_replicated():
        return OpSharding.replicated()
    proto = hlo.to_proto()
    if proto.type != xla_client.OpSharding.Type.OTHER:
        return OpSharding.replicated()
    dims = list(proto.tile_assignment_dimensions)
    devices = list(proto.tile_assignment_devices)
    if not devices:  # iota form: devices listed by the reshape/transpose it describes
        ids = np.arange(int(np.prod(dims))).reshape(list(proto.iota_reshape_dims))
        devices = ids.transpose(list(proto.iota_transpose_perm)).reshape(-1).tolist()
    return OpSharding.from_fields(
        ProtoType.OTHER, dims, devices, bool(proto.replicate_on_last_tile_dim)
    )


# -- the graph handed to the compiler ------------------------------------------------------------
@dataclass(frozen=True)
class GraphInput:
    """A device-data input: global shape, dtype, sharding, and whether an output reuses it."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    sharding: OpSharding | None = None
    donated: bool = False


# In-place ops recorded by the simulator whose functional form is not "drop the underscore".
_FUNCTIONAL = {
    aten.bernoulli_.float: aten.bernoulli.p,
    aten.copy_.default: aten.copy.default,
}


def _view_any_layout(view: Any) -> Callable[..., Any]:
    """``view`` as the simulator records it: of a tensor that reports row-major strides,
    whatever it is. The replay's CPU fakes keep PyTorch's own strides, where a transposed one
    cannot be viewed to a new shape: that one is viewed as its row-major copy (as the simulator
    computes it)."""

    def replayed(x: torch.Tensor, *rest: Any) -> torch.Tensor:
        try:
            return view(x, *rest)
        except (RuntimeError, ValueError):  # fake tensors refuse with either
            return view(aten.clone.default(x, memory_format=torch.contiguous_format), *rest)

    return replayed


_LAYOUT_FREE = {op: _view_any_layout(op) for op in (aten.view.default, aten._unsafe_view.default)}


def functional_op(op: Any) -> Any:
    """The out-of-place op computing what in-place ``op`` writes (replayed as a new value);
    for any other op, the op the replay runs for it."""
    if op in _LAYOUT_FREE:
        return _LAYOUT_FREE[op]
    if op in _FUNCTIONAL:
        return _FUNCTIONAL[op]
    schema = op._schema
    name = schema.name.split("::", 1)[1]
    if not schema.is_mutable:
        return op
    if name.endswith("_") and not name.startswith("_"):
        packet = getattr(aten, name[:-1], None)
        overload = getattr(packet, op._overloadname, None) if packet is not None else None
        if overload is not None:
            _FUNCTIONAL[op] = overload
            return overload
    raise NotImplementedError(f"the TPU compiler layer cannot replay the mutating op {op}")


@torch.library.custom_op("xlasim_compiler::constrain", mutates_args=())
def _constrain(x: torch.Tensor, sharding: int) -> torch.Tensor:
    """A sharding constraint in the replayed graph: ``mark_sharding`` on a pending tensor,
    which torch_xla records as a custom-sharding node.  ``sharding`` indexes the graph's list
    of constraints."""
    return x.clone()


@_constrain.register_fake
def _(x: torch.Tensor, sharding: int) -> torch.Tensor:
    return torch.empty_like(x)


CONSTRAIN = torch.ops.xlasim_compiler.constrain.default


@dataclass
class ReplayedGraph:
    """A recorded graph as a functional core-ATen FX graph over its device-data inputs."""

    module: torch.fx.GraphModule
    inputs: list[GraphInput]
    # output position -> input position, for outputs that update their own input in place
    aliases: dict[int, int]
    trace_seconds: float
    # The shardings the graph's ``constrain`` nodes name, by index.
    constraints: list[OpSharding] = field(default_factory=list)
    # output position -> the sharding the program gave that output (mark_sharding).
    output_constraints: dict[int, OpSharding] = field(default_factory=dict)


def _post_order(roots: Sequence[Node]) -> list[tuple[Node, RecordedCall]]:
    order: list[tuple[Node, RecordedCall]] = []
    seen: set[int] = set()
    stack: list[tuple[Any, bool]] = [(n, False) for n in reversed(roots)]
    while stack:
        item, expanded = stack.pop()
        if not isinstance(item, Node) or id(item) in seen:
            continue
        call = item.call
        if call is None:
            raise RuntimeError(
                f"xlasim: the pending op {item.op} was recorded before the TPU compiler was "
                "attached; enter the simulation with the compiler before the first op"
            )
        if expanded:
            seen.add(id(item))
            order.append((item, call))
            continue
        stack.append((item, True))
        stack.extend((i, False) for i in reversed(item.inputs))
    return order


def _sharding_of(tensor: Any) -> OpSharding | None:
    sharding = getattr(tensor, "_sharding", None)
    return None if sharding is None else sharding.op


def replay(tensors: Sequence[Any]) -> ReplayedGraph:
    """The graph that materializes the pending ``tensors`` (simulated device tensors)."""
    roots = [t._node for t in tensors]
    order = _post_order(roots)
    # Device-data inputs, deduplicated by tensor identity (one buffer, one parameter).
    leaf_index: dict[int, int] = {}
    inputs: list[GraphInput] = []
    for node, call in order:
        for ref in _refs(call.args, call.kwargs):
            if ref.tensor is None:
                continue
            tensor = ref.tensor()
            ident = id(tensor) if tensor is not None else id(ref)
            if ident not in leaf_index:
                leaf_index[ident] = len(inputs)
                shape, dtype = node.inputs[ref.index][:2]
                sharding = ref.sharding.op if ref.sharding is not None else None
                inputs.append(GraphInput(tuple(shape), dtype, sharding))
    # An output that is a tensor the graph read as device data overwrites that buffer: XLA
    # aliases the two (torch_xla donates it), which is what makes alias bytes right.
    aliases = {}
    for out_pos, t in enumerate(tensors):
        in_pos = leaf_index.get(id(t))
        if in_pos is not None and inputs[in_pos].shape == tuple(t.shape):
            aliases[out_pos] = in_pos
    for in_pos in aliases.values():
        old = inputs[in_pos]
        inputs[in_pos] = GraphInput(old.shape, old.dtype, old.sharding, donated=True)
    output_constraints = {
        pos: sharding
        for pos, t in enumerate(tensors)
        if pos not in aliases and (sharding := _sharding_of(t)) is not None
    }
    constraints: list[OpSharding] = []
    constraint_index: dict[str, int] = {}

    def run(*values: Any) -> list[Any]:
        # id(args tuple) -> the op's result: the nodes of one call's outputs share the tuple.
        results: dict[int, Any] = {}
        env: dict[int, Any] = {}
        constrained: dict[tuple[int, int], Any] = {}

        def value_of(node: Node, ref: InputRef) -> Any:
            if ref.tensor is not None:
                tensor = ref.tensor()
                return values[leaf_index[id(tensor) if tensor is not None else id(ref)]]
            source = node.inputs[ref.index]
            value = env[id(source)]
            if ref.sharding is None:
                return value
            # A pending value the program annotated with mark_sharding before this op.
            text = ref.sharding.op.to_string()
            index = constraint_index.get(text)
            if index is None:
                index = constraint_index[text] = len(constraints)
                constraints.append(ref.sharding.op)
            key = (id(source), index)
            if key not in constrained:
                constrained[key] = CONSTRAIN(value, index)
            return constrained[key]

        for node, call in order:
            result = results.get(id(call.args))
            if result is None:
                args = _substitute(call.args, node, value_of)
                kwargs = _substitute(call.kwargs, node, value_of)
                if node.op == "aten::empty":
                    result = torch.zeros(args[0], dtype=kwargs["dtype"])
                else:
                    kwargs.pop("generator", None)
                    result = functional_op(node.op)(*args, **kwargs)
                results[id(call.args)] = result
            env[id(node)] = result[call.index] if isinstance(result, (tuple, list)) else result
        return [env[id(n)] for n in roots]

    start = time.perf_counter()
    # Shapes only: fake inputs, so tracing a graph of any size allocates nothing.
    with dry_run.cpu_factories():
        with FakeTensorMode():
            fakes = [torch.empty(i.shape, dtype=i.dtype) for i in inputs]
        decompositions = dict(core_aten_decompositions())
        module = make_fx(run, decomposition_table=decompositions, tracing_mode="fake")(*fakes)
    return ReplayedGraph(
        module,
        inputs,
        aliases,
        time.perf_counter() - start,
        constraints,
        output_constraints,
    )


def _refs(args: Any, kwargs: dict[str, Any]) -> list[InputRef]:
    found: list[InputRef] = []
    stack = [args, list(kwargs.values())]
    while stack:
        item = stack.pop()
        if isinstance(item, InputRef):
            found.append(item)
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return found


_CPU = torch.device("cpu")


def _substitute(template: Any, node: Node, value_of: Any) -> Any:
    if isinstance(template, InputRef):
        return value_of(node, template)
    if isinstance(template, torch.device) and template.type == "xla":
        # The replay traces on CPU fakes: an op that names the xla device (the backward of a
        # dtype cast) must not move its result off them.
        return _CPU
    if isinstance(template, (list, tuple)):
        return type(template)(_substitute(x, node, value_of) for x in template)
    if isinstance(template, dict):
        return {k: _substitute(v, node, value_of) for k, v in template.items()}
    return template


# -- lowering an FX graph to a jax function ------------------------------------------------------
def _constant(value: torch.Tensor) -> Any:
    """A tensor the graph holds as a constant (a CPU tensor the program passed to an op)."""
    dtype = aten_to_jax.jax_dtype(value.dtype)
    if value.is_meta:  # a dry run's shape-only CPU tensor: its values do not matter here
        return jax.numpy.zeros(tuple(value.shape), dtype)
    return jax.numpy.asarray(value.detach().numpy()).astype(dtype)


def jax_function(module: torch.fx.GraphModule, constraints: Sequence[Any] = ()) -> Any:
    """``module``'s graph as a function of jax arrays (one pass over its nodes);
    ``constraints`` are the jax shardings its ``constrain`` nodes name."""
    nodes = list(module.graph.nodes)
    constants = {name: _constant(value) for name, value in module.named_buffers()}

    def run(*args: Any) -> list[Any]:
        env: dict[Any, Any] = {}
        positional = iter(args)
        for n in nodes:
            if n.op == "placeholder":
                env[n] = next(positional)
            elif n.op == "get_attr":
                env[n] = constants.get(n.target)
                if env[n] is None:
                    env[n] = _constant(getattr(module, n.target))
            elif n.op == "call_function":
                a = torch.fx.node.map_arg(n.args, env.__getitem__)
                k = torch.fx.node.map_arg(n.kwargs, env.__getitem__)
                if n.target is CONSTRAIN:
                    env[n] = jax.lax.with_sharding_constraint(a[0], constraints[a[1]])
                elif isinstance(n.target, torch._ops.OpOverload):
                    # The scope names the aten op in the compiler's reports (op_name=...).
                    with jax.named_scope(str(n.target)):
                        env[n] = aten_to_jax.lower(n.target)(*a, **k)
                else:  # operator.getitem on a multi-output op
                    env[n] = n.target(*a, **k)
            elif n.op == "output":
                out = torch.fx.node.map_arg(n.args[0], env.__getitem__)
                return list(out) if isinstance(out, (list, tuple)) else [out]
        raise AssertionError("an FX graph ends with its output node")

    return run


# -- out of memory -------------------------------------------------------------------------------
# Compiling once more with this option completes the compile past the first overflow, so the
# figures and libtpu's report of the largest buffers (written to its log) are available.
_NO_CRASH_ON_OOM = {"xla_tpu_no_crash_on_oom": True}
# libtpu's status text starts with its code ("RESOURCE_EXHAUSTED: "), which torch_xla drops.
_STATUS_CODE = re.compile(r"^[A-Z_]+: ")
_ALLOCATION = re.compile(
    r"^\s+\d+\. Size: (?P<size>\S+)\n(?:\s+Operator: (?P<op>.*)\n)?\s+Shape: (?P<shape>\S+)\n"
    r"(?:\s+Unpadded size: \S+\n)?\s+XLA label: (?P<label>.*)\n",
    re.MULTILINE,
)
_ARGUMENTS_HEADER = "Largest program arguments and outputs"
_ARGUMENT_LABEL = re.compile(r"^Argument (\d+) ")
# libtpu's message when one buffer alone overflows names the program operand.
_OPERAND = re.compile(r"index: (\d+), kind: input")
_OP_NAME = re.compile(r'op_name="(?:[^"/]*/)*?(aten\.[^"/]+)')


def _log_file() -> str | None:
    """This process's libtpu INFO log (file names end with the process id)."""
    try:
        names = os.listdir(LOG_DIR)
    except OSError:
        return None
    suffix = f".{os.getpid()}"
    mine = sorted(n for n in names if ".log.INFO." in n and n.endswith(suffix))
    return os.path.join(LOG_DIR, mine[-1]) if mine else None


def _log_size() -> int:
    path = _log_file()
    return os.path.getsize(path) if path else 0


def _log_since(offset: int) -> str:
    path = _log_file()
    if path is None:
        return ""
    with open(path, encoding="utf-8", errors="replace") as f:
        f.seek(offset)
        return f.read()


def biggest_buffers(report: str, limit: int = 5) -> tuple[list[dict[str, str]], ...]:
    """libtpu's two "largest" lists: program allocations (temporaries), then arguments and
    outputs; ``limit`` of each."""
    split = report.find(_ARGUMENTS_HEADER)
    parts = (report, "") if split < 0 else (report[:split], report[split:])
    lists = []
    for part in parts:
        rows = [
            {
                "size": m["size"],
                "shape": m["shape"].split("{")[0],
                "operator": (m["op"] or "").strip(),
                "label": m["label"].strip(),
            }
            for m in _ALLOCATION.finditer(part)
        ]
        lists.append(rows[:limit])
    return tuple(lists)


def _describe_input(inputs: Sequence[GraphInput], position: int) -> str:
    given = inputs[position]
    sharding = given.sharding.to_string() if given.sharding is not None else "{replicated}"
    dtype = str(given.dtype).replace("torch.", "")
    return f"graph input {position}: shape {list(given.shape)} {dtype} sharding {sharding}"


def _describe_buffer(row: dict[str, str], inputs: Sequence[GraphInput]) -> str:
    text = f"  {row['size']:>8} {row['shape']}"
    argument = _ARGUMENT_LABEL.match(row["label"])
    if argument and int(argument[1]) < len(inputs):
        return f"{text} {_describe_input(inputs, int(argument[1]))}"
    op = _OP_NAME.search(row["operator"])
    return f"{text} {op[1] if op else row['label'][:100]}"


def _oom_report(log: str) -> str:
    start = log.find("Total hbm usage")
    if start < 0:
        return ""
    end = log.find("\nI", log.find(_ARGUMENTS_HEADER, start))
    return log[start : end if end > 0 else None]


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / 2**30:.2f} GiB"


# -- compiling -----------------------------------------------------------------------------------
class LibtpuCompiler:
    """Compiles the simulator's graphs for one slice, or for ``num_slices`` of them joined over
    DCN (libtpu plans the collectives that cross slices); results are cached by graph hash."""

    def __init__(self, spec: SliceSpec, num_slices: int = 1) -> None:
        if spec.accelerator not in _TOPOLOGY_NAMES:
            raise NotImplementedError(f"libtpu has no topology for {spec.accelerator}")
        self.spec = spec
        self.num_slices = num_slices
        self.devices = topology_devices(spec, num_slices)
        per_chip = spec.devices_per_chip
        flops, bandwidth = _CHIP_PEAKS[spec.accelerator]
        self.hbm_bytes = spec.hbm_bytes_per_chip // per_chip
        self.peak_flops_per_second = flops / per_chip
        self.hbm_bytes_per_second = bandwidth / per_chip
        # By graph hash, in compile order: what xlasim.compiled_graphs() lists.
        self.compiled: dict[int, CompiledGraph] = {}
        self._progress = bool(os.environ.get(REPORT_ENV))

    @property
    def _slices(self) -> str:
        return f"{self.num_slices} x " if self.num_slices > 1 else ""

    def compile_graph(self, tensors: list[Any], key: int, site: str) -> CompiledGraph:
        """Compile the graph materializing ``tensors`` (what a sync of them compiles)."""
        cached = self.compiled.get(key)
        if cached is not None:
            return cached
        if self._progress:
            print(
                f"xlasim: compiling graph {key & 0xFFFFFFFF:08x} ({site}) with libtpu for "
                f"{self._slices}{self.spec.accelerator} {self.spec.topology} "
                f"({len(self.devices)} devices); large slices take minutes",
                file=sys.stderr,
                flush=True,
            )
        result = self.compile(replay(tensors), key, site)
        self.compiled[key] = result
        if self._progress:
            print(
                f"xlasim: graph {key & 0xFFFFFFFF:08x} compiled in {result.compile_seconds:.1f}s: "
                f"peak {_gib(result.peak_bytes)} of {_gib(self.hbm_bytes)} per device",
                file=sys.stderr,
                flush=True,
            )
        return result

    def compile(self, graph: ReplayedGraph, key: int = 0, site: str = "") -> CompiledGraph:
        with wide_integers():
            return self._compile(graph, key, site)

    def _compile(self, graph: ReplayedGraph, key: int, site: str) -> CompiledGraph:
        start = time.perf_counter()
        shardings = [jax_sharding(i.sharding, self.devices) for i in graph.inputs]
        avals = [
            jax.ShapeDtypeStruct(i.shape, aten_to_jax.jax_dtype(i.dtype), sharding=s)
            for i, s in zip(graph.inputs, shardings, strict=True)
        ]
        body = jax_function(
            graph.module, [jax_sharding(c, self.devices) for c in graph.constraints]
        )
        # An output written over its input keeps the input's sharding, so XLA can alias it;
        # an output the program annotated keeps that sharding.
        out_shardings = {out: shardings[inp] for out, inp in graph.aliases.items()}
        for out, sharding in graph.output_constraints.items():
            out_shardings[out] = jax_sharding(sharding, self.devices)

        def fn(*args: Any) -> list[Any]:
            outs = body(*args)
            for position, sharding in out_shardings.items():
                outs[position] = jax.lax.with_sharding_constraint(outs[position], sharding)
            return outs

        donate = tuple(sorted(set(graph.aliases.values())))
        lowered = jax.jit(fn, donate_argnums=donate, keep_unused=True).lower(*avals)
        trace = graph.trace_seconds + time.perf_counter() - start
        offset = _log_size()
        start = time.perf_counter()
        try:
            executable = lowered.compile()
        except Exception as exc:  # noqa: BLE001 - jax raises its own JaxRuntimeError type
            raise self._failure(lowered, str(exc), offset, graph.inputs, key, site) from None
        seconds = time.perf_counter() - start
        return self._figures(executable, key, site, seconds, trace)

    def _figures(
        self, executable: Any, key: int, site: str, seconds: float, trace: float
    ) -> CompiledGraph:
        memory = executable.memory_analysis()
        cost = executable.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        return CompiledGraph(
            key=key,
            site=site,
            argument_bytes=int(memory.argument_size_in_bytes),
            output_bytes=int(memory.output_size_in_bytes),
            alias_bytes=int(memory.alias_size_in_bytes),
            temp_bytes=int(memory.temp_size_in_bytes),
            generated_code_bytes=int(memory.generated_code_size_in_bytes),
            flops=float(cost.get("flops", 0.0)),
            bytes_accessed=float(cost.get("bytes accessed", 0.0)),
            compile_seconds=seconds,
            trace_seconds=trace,
            peak_flops_per_second=self.peak_flops_per_second,
            hbm_bytes_per_second=self.hbm_bytes_per_second,
            hbm_bytes=self.hbm_bytes,
            output_shardings=tuple(op_sharding(s) for s in executable.output_shardings),
        )

    def _failure(
        self,
        lowered: Any,
        status: str,
        offset: int,
        inputs: Sequence[GraphInput],
        key: int,
        site: str,
    ) -> CompileError:
        """The compile error torch_xla would raise, with libtpu's figures and the biggest
        buffers (mapped back to the graph's inputs) when the graph does not fit."""
        message = _STATUS_CODE.sub("", status.strip(), count=1)
        if not status.startswith("RESOURCE_EXHAUSTED"):
            return CompileError(message)
        lines = [
            message,
            f"xlasim: graph {key & 0xFFFFFFFF:08x} cut at {site or '<unknown>'} does not fit "
            f"{self._slices}{self.spec.accelerator} {self.spec.topology} ({_gib(self.hbm_bytes)} "
            "of HBM per "
            "device); libtpu's figures per device:",
        ]
        # libtpu's fast out-of-memory exit names no buffer; compiling again without stopping
        # at the first overflow gives the figures and writes the per-buffer report to the log.
        try:
            figures = self._figures(lowered.compile(_NO_CRASH_ON_OOM), key, site, 0.0, 0.0)
        except Exception as exc:  # noqa: BLE001 - e.g. one input alone larger than HBM
            detail = _STATUS_CODE.sub("", str(exc).strip().splitlines()[0], count=1)
            lines.append(f"  {detail}")
            operand = _OPERAND.search(detail)
            if operand and int(operand[1]) < len(inputs):
                lines.append(f"  that buffer is {_describe_input(inputs, int(operand[1]))}")
        else:
            lines.append(
                f"  arguments {figures.argument_bytes:,} B, outputs {figures.output_bytes:,} B "
                f"(aliased with arguments {figures.alias_bytes:,} B), temporaries "
                f"{figures.temp_bytes:,} B, program {figures.generated_code_bytes:,} B: "
                f"peak {figures.peak_bytes:,} B of {self.hbm_bytes:,} B"
            )
        temporaries, arguments = biggest_buffers(_oom_report(_log_since(offset)))
        for title, rows in (("temporaries", temporaries), ("arguments and outputs", arguments)):
            if rows:
                lines.append(f"largest {title} per device:")
                lines += [_describe_buffer(row, inputs) for row in rows]
        return CompileError("\n".join(lines))
