"""The real TPU compiler (libtpu, through jax's ahead-of-time API) for a simulated slice.

A graph the simulator counts as an uncached compile is replayed into a functional core-ATen
graph (``torch.fx`` with torch's own decompositions, on fake tensors: no values), lowered to jax
(``aten_to_jax``) and compiled by libtpu for the slice's topology with the tensors' shardings.
No TPU chip is needed: libtpu compiles for a topology it is told about.  What comes back is
the compiler's own per-chip accounting (``memory_analysis``/``cost_analysis``); numerical
results still come from the simulator's CPU computation.

Optional: needs the ``tpu-compiler`` extra (jax[tpu], which brings libtpu; libtpu is under
Google Cloud terms, so it is never vendored).  Nothing imports this module unless the compiler
is asked for, so ``import xlasim`` never imports jax.

Device order: libtpu's topology lists devices by chip coordinates, and the simulator's device
ids follow the same coordinates (see ``sharding.device_layout``); devices are matched by
coordinates and core, never by libtpu's ``device.id`` (which numbers chips row-major over the
whole grid).  Shardings are handed over as GSPMD ``OpSharding`` protos over that device list,
the representation torch_xla itself compiles with, so any tile assignment carries over as is.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# libtpu reads these when jax loads it: a topology without chips, no metadata server.
# Set before jax is imported; a user's own values win.
_TPU_ENV = {
    "TPU_SKIP_MDS_QUERY": "1",
    "TPU_WORKER_HOSTNAMES": "localhost",
    "JAX_PLATFORMS": "cpu",
    # Any valid type: without one libtpu logs host-bound errors (the figures do not change).
    "TPU_ACCELERATOR_TYPE": "v5litepod-16",
    # libtpu otherwise takes /tmp/libtpu_lockfile: a second process (pytest-xdist, simulated
    # hosts, Ray workers) fails with "ABORTED: Internal error when accessing libtpu multi-process
    # lockfile". Compiling needs no chip, so processes can share it.
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
}
for _name, _value in _TPU_ENV.items():
    os.environ.setdefault(_name, _value)

import jax  # noqa: E402 - after the environment above
import numpy as np  # noqa: E402
import torch  # noqa: E402
from jax._src.lib import xla_client  # noqa: E402 - the GSPMD sharding proto
from jax._src.sharding_impls import GSPMDSharding  # noqa: E402
from jax.experimental import topologies  # noqa: E402
from torch._decomp import core_aten_decompositions  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

from tpu_backend.topology import SliceSpec  # noqa: E402
from xlasim.runtime import aten_to_jax  # noqa: E402
from xlasim.runtime.graph import InputRef, Node, RecordedCall  # noqa: E402
from xlasim.sharding.device_layout import device_attributes  # noqa: E402
from xlasim.sharding.op_sharding import OpSharding, ProtoType  # noqa: E402

# torch_xla 2.9 partitions with GSPMD, and GSPMD shardings take any device order; Shardy (jax's
# default) would need one mesh for all inputs.
jax.config.update("jax_use_shardy_partitioner", False)

aten = torch.ops.aten

# -- topology ----------------------------------------------------------------------------------
# libtpu's topology names per generation, and the options that make one device per chip where
# torch_xla has one (v4 is megacore in torch_xla; libtpu lists its two cores unless asked).
_TOPOLOGY_NAMES = {
    "v2": ("v2", {}),
    "v3": ("v3", {}),
    "v4": ("v4", {"chip_config_name": "megacore"}),
    "v5litepod": ("v5e", {}),
    "v5p": ("v5p", {}),
    "v6e": ("v6e", {}),
    "v7x": ("tpu7x", {}),
}

# Peak dense bf16 FLOP/s and HBM bytes/s per chip (Google Cloud TPU system-architecture pages).
# Only for the roofline estimate: f32 matmuls, collectives and overlap are not modelled.
PEAK = {
    "v2": (45e12, 700e9),
    "v3": (123e12, 900e9),
    "v4": (275e12, 1228e9),
    "v5litepod": (197e12, 819e9),
    "v5p": (459e12, 2765e9),
    "v6e": (918e12, 1640e9),
    "v7x": (2307e12, 7380e9),
}

_topologies: dict[tuple[str, tuple[int, ...]], list[Any]] = {}


def topology_devices(spec: SliceSpec) -> list[Any]:
    """libtpu's devices for ``spec``, in the simulator's device-id order."""
    key = (spec.accelerator, spec.dims)
    cached = _topologies.get(key)
    if cached is not None:
        return cached
    name, options = _TOPOLOGY_NAMES[spec.accelerator]
    shape = "x".join(str(d) for d in spec.dims)
    devices = topologies.get_topology_desc(f"{name}:{shape}", "tpu", **options).devices
    by_place = {(tuple(d.coords), d.core_on_chip): d for d in devices}
    ordered = []
    for attrs in device_attributes(spec):
        place = (tuple(attrs["coords"]), attrs["core_on_chip"])
        if place not in by_place or len(devices) != spec.num_devices:
            raise NotImplementedError(
                f"libtpu's {name}:{shape} topology ({len(devices)} devices) does not match the "
                f"simulated slice ({spec.num_devices} devices): no device at {place}"
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


def functional_op(op: Any) -> Any:
    """The out-of-place op computing what in-place ``op`` writes (replayed as a new value)."""
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


@dataclass
class ReplayedGraph:
    """A recorded graph as a functional core-ATen FX graph over its device-data inputs."""

    module: torch.fx.GraphModule
    inputs: list[GraphInput]
    # output position -> input position, for outputs that update their own input in place
    aliases: dict[int, int]
    trace_seconds: float


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
                "switched on; enable it before the first op of the step"
            )
        if expanded:
            seen.add(id(item))
            order.append((item, call))
            continue
        stack.append((item, True))
        stack.extend((i, False) for i in reversed(item.inputs))
    return order


def replay(tensors: Sequence[Any]) -> ReplayedGraph:
    """The graph that materializes the pending ``tensors`` (simulated device tensors)."""
    roots = [t._node for t in tensors]
    order = _post_order(roots)
    # Device-data inputs, deduplicated by tensor identity (one buffer, one parameter).
    leaf_index: dict[int, int] = {}
    leaves: list[tuple[Any, InputRef, Any]] = []  # (key tensor-or-None, ref, leaf key tuple)
    for node, call in order:
        for ref in _refs(call.args, call.kwargs):
            if ref.tensor is None:
                continue
            tensor = ref.tensor()
            ident = id(tensor) if tensor is not None else id(ref)
            if ident not in leaf_index:
                leaf_index[ident] = len(leaves)
                leaves.append((tensor, ref, node.inputs[ref.index]))
    inputs = [
        GraphInput(tuple(key[0]), key[1], ref.sharding.op if ref.sharding is not None else None)
        for _, ref, key in leaves
    ]
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

    def run(*values: Any) -> list[Any]:
        # id(args tuple) -> the op's result: the nodes of one call's outputs share the tuple.
        results: dict[int, Any] = {}
        env: dict[int, Any] = {}

        def value_of(node: Node, ref: InputRef) -> Any:
            if ref.tensor is not None:
                tensor = ref.tensor()
                return values[leaf_index[id(tensor) if tensor is not None else id(ref)]]
            return env[id(node.inputs[ref.index])]

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
    with FakeTensorMode():
        fakes = [torch.empty(i.shape, dtype=i.dtype) for i in inputs]
    decompositions = dict(core_aten_decompositions())
    module = make_fx(run, decomposition_table=decompositions, tracing_mode="fake")(*fakes)
    return ReplayedGraph(module, inputs, aliases, time.perf_counter() - start)


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


def _substitute(template: Any, node: Node, value_of: Any) -> Any:
    if isinstance(template, InputRef):
        return value_of(node, template)
    if isinstance(template, (list, tuple)):
        return type(template)(_substitute(x, node, value_of) for x in template)
    if isinstance(template, dict):
        return {k: _substitute(v, node, value_of) for k, v in template.items()}
    return template


# -- lowering an FX graph to a jax function ------------------------------------------------------
def jax_function(module: torch.fx.GraphModule) -> Any:
    """``module``'s graph as a function of jax arrays (one pass over its nodes)."""
    nodes = list(module.graph.nodes)
    constants = {
        name: jax.numpy.asarray(value.detach().numpy()) for name, value in module.named_buffers()
    }

    def run(*args: Any) -> list[Any]:
        env: dict[Any, Any] = {}
        positional = iter(args)
        for n in nodes:
            if n.op == "placeholder":
                env[n] = next(positional)
            elif n.op == "get_attr":
                env[n] = constants.get(n.target, getattr(module, n.target))
            elif n.op == "call_function":
                a = torch.fx.node.map_arg(n.args, env.__getitem__)
                k = torch.fx.node.map_arg(n.kwargs, env.__getitem__)
                if isinstance(n.target, torch._ops.OpOverload):
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


# -- compiling -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class CompiledGraph:
    """libtpu's figures for one graph, per chip."""

    key: int
    site: str
    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    generated_code_bytes: int
    flops: float
    bytes_accessed: float
    compile_seconds: float
    trace_seconds: float
    peak_flops_per_second: float
    hbm_bytes_per_second: float
    # What XLA's sharding propagation gave each output (the simulator cannot derive all).
    output_shardings: tuple[OpSharding, ...] = ()

    @property
    def peak_bytes(self) -> int:
        """HBM the program needs at once on a chip: inputs, outputs not written over an
        input, temporaries and the program itself."""
        return (
            self.argument_bytes
            + self.output_bytes
            - self.alias_bytes
            + self.temp_bytes
            + self.generated_code_bytes
        )

    @property
    def step_seconds(self) -> float:
        """Roofline estimate: the larger of compute time at peak FLOP/s and HBM traffic time
        at peak bandwidth. A lower bound (no collectives, no f32 slowdown, perfect overlap)."""
        return max(
            self.flops / self.peak_flops_per_second, self.bytes_accessed / self.hbm_bytes_per_second
        )


class CompileOutOfMemory(RuntimeError):
    """A graph that does not fit a chip's HBM, as libtpu reports it."""


_NO_CRASH_ON_OOM = {"xla_tpu_no_crash_on_oom": True}


def log_dir() -> str:
    """Where libtpu writes its logs: ``TPU_LOG_DIR``, else ``tpu_logs`` under the temp dir."""
    return os.environ.get("TPU_LOG_DIR") or os.path.join(tempfile.gettempdir(), "tpu_logs")


def _log_file() -> str | None:
    """This process's libtpu INFO log (file names end with the process id)."""
    directory = log_dir()
    try:
        names = os.listdir(directory)
    except OSError:
        return None
    suffix = f".{os.getpid()}"
    mine = sorted(n for n in names if ".log.INFO." in n and n.endswith(suffix))
    return os.path.join(directory, mine[-1]) if mine else None


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


_ALLOCATION = re.compile(
    r"^\s+\d+\. Size: (?P<size>\S+)\n(?:\s+Operator: (?P<op>.*)\n)?\s+Shape: (?P<shape>\S+)\n"
    r"(?:\s+Unpadded size: \S+\n)?\s+XLA label: (?P<label>.*)\n",
    re.MULTILINE,
)


_ARGUMENTS_HEADER = "Largest program arguments and outputs"


def biggest_buffers(report: str, limit: int = 5) -> tuple[list[dict[str, str]], ...]:
    """The compiler's two "largest" lists: program allocations (temporaries), then
    arguments and outputs; ``limit`` of each."""
    split = report.find(_ARGUMENTS_HEADER)
    parts = (report, "") if split < 0 else (report[:split], report[split:])
    lists = []
    for part in parts:
        rows = []
        for m in _ALLOCATION.finditer(part):
            rows.append(
                {
                    "size": m["size"],
                    "shape": m["shape"].split("{")[0],
                    "operator": (m["op"] or "").strip(),
                    "label": m["label"].strip()[:120],
                }
            )
        lists.append(rows[:limit])
    return tuple(lists)


_ARGUMENT_LABEL = re.compile(r"^Argument (\d+) ")


# libtpu's message when one buffer alone overflows names the program operand.
_OPERAND = re.compile(r"index: (\d+), kind: input")


def _describe_buffer(
    row: dict[str, str], inputs: Sequence[GraphInput], position: int | None = None
) -> str:
    text = f"  {row['size']:>8} {row['shape']}"
    argument = _ARGUMENT_LABEL.match(row["label"])
    if argument:
        position = int(argument[1])
    if position is not None and position < len(inputs):
        given = inputs[position]
        sharding = given.sharding.to_string() if given.sharding is not None else "{replicated}"
        return (
            f"{text} graph input {position}: shape {list(given.shape)} "
            f"{str(given.dtype).replace('torch.', '')} sharding {sharding}"
        )
    return f"{text} {row['operator'] or row['label']}"


def _oom_report(text: str) -> str:
    start = text.find("Total hbm usage")
    if start < 0:
        return ""
    end = text.find("\nI", text.find("Largest program arguments and outputs", start))
    return text[start : end if end > 0 else None]


class LibtpuCompiler:
    """Compiles the simulator's graphs for one slice; results are cached by graph hash."""

    def __init__(self, spec: SliceSpec) -> None:
        if spec.accelerator not in _TOPOLOGY_NAMES:
            raise NotImplementedError(f"libtpu has no topology for {spec.accelerator}")
        self.spec = spec
        self.devices = topology_devices(spec)
        self.compiled: dict[int, CompiledGraph] = {}
        self.hbm_bytes = spec.hbm_bytes_per_chip

    def compile_pending(self, tensors: Sequence[Any], key: int, site: str = "") -> CompiledGraph:
        """Compile the graph materializing ``tensors`` (what a sync of them would compile)."""
        cached = self.compiled.get(key)
        if cached is not None:
            return cached
        graph = replay(tensors)
        result = self.compile(graph, key, site)
        self.compiled[key] = result
        return result

    def compile(self, graph: ReplayedGraph, key: int = 0, site: str = "") -> CompiledGraph:
        shardings = [jax_sharding(i.sharding, self.devices) for i in graph.inputs]
        avals = [
            jax.ShapeDtypeStruct(i.shape, aten_to_jax.jax_dtype(i.dtype), sharding=s)
            for i, s in zip(graph.inputs, shardings, strict=True)
        ]
        body = jax_function(graph.module)
        aliases = graph.aliases

        def fn(*args: Any) -> list[Any]:
            outs = body(*args)
            # An output written over its input keeps the input's sharding, so XLA can alias.
            for out_pos, in_pos in aliases.items():
                outs[out_pos] = jax.lax.with_sharding_constraint(outs[out_pos], shardings[in_pos])
            return outs

        donate = tuple(sorted(set(aliases.values())))
        lowered = jax.jit(fn, donate_argnums=donate, keep_unused=True).lower(*avals)
        offset = _log_size()
        start = time.perf_counter()
        try:
            executable = lowered.compile()
        except Exception as exc:  # jax raises its own JaxRuntimeError type
            if "RESOURCE_EXHAUSTED" not in str(exc):
                raise
            raise self._out_of_memory(lowered, str(exc), offset, graph.inputs) from None
        seconds = time.perf_counter() - start
        return self._figures(executable, key, site, seconds, graph.trace_seconds)

    def _figures(self, executable: Any, key: int, site: str, seconds: float, trace: float):
        memory = executable.memory_analysis()
        cost = executable.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        flops, bandwidth = PEAK[self.spec.accelerator]
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
            peak_flops_per_second=flops,
            hbm_bytes_per_second=bandwidth,
            output_shardings=tuple(op_sharding(s) for s in executable.output_shardings),
        )

    def _out_of_memory(
        self, lowered: Any, message: str, offset: int, inputs: Sequence[GraphInput]
    ) -> CompileOutOfMemory:
        # libtpu's fast out-of-memory exit names no buffer; compiling again without stopping
        # at the first overflow writes its full report (largest allocations) to the log.
        figures = None
        detail = ""
        try:
            figures = self._figures(lowered.compile(_NO_CRASH_ON_OOM), 0, "", 0.0, 0.0)
        except Exception as exc:  # noqa: BLE001 - e.g. one input alone larger than HBM
            detail = str(exc).strip()
        report = _oom_report(_log_since(offset))
        lines = [f"Bad StatusOr access: {message.strip()}"]
        if detail:
            lines.append(detail.splitlines()[0])
            operand = _OPERAND.search(detail)
            if operand and int(operand[1]) < len(inputs):
                lines.append(
                    _describe_buffer(
                        {"size": "", "shape": "", "label": ""}, inputs, int(operand[1])
                    ).strip()
                )
        if figures is not None:
            lines.append(
                f"per chip: arguments {figures.argument_bytes:,} B, outputs "
                f"{figures.output_bytes:,} B (aliased {figures.alias_bytes:,} B), temporaries "
                f"{figures.temp_bytes:,} B, program {figures.generated_code_bytes:,} B; "
                f"HBM {self.hbm_bytes:,} B"
            )
        temporaries, arguments = biggest_buffers(report)
        for title, rows in (("temporaries", temporaries), ("arguments and outputs", arguments)):
            if rows:
                lines.append(f"largest {title} per chip:")
                lines += [_describe_buffer(row, inputs) for row in rows]
        if not report:
            lines.append(f"(libtpu's per-buffer report is in {log_dir()})")
        error = CompileOutOfMemory("\n".join(lines))
        error.figures = figures  # type: ignore[attr-defined]
        error.report = report  # type: ignore[attr-defined]
        return error
