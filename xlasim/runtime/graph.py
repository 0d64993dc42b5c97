"""Lazy-graph accounting: what real torch_xla would compile, and when.

Every simulated op computes eagerly on CPU (so numerics equal eager torch) and also records an IR
node whose hash covers the op, its non-float arguments, its output shape/dtype and its inputs'
hashes — the same things torch_xla's graph hash covers. A sync turns the live tensors' pending
nodes into one graph; a graph hash seen before is a ``CachedCompile``, a new one an
``UncachedCompile`` (or a ``PersistentCacheHit`` when the on-disk cache has it).
"""

from __future__ import annotations

import json
import os
import sys
import time
import weakref
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from xlasim.runtime import debug_analysis
from xlasim.runtime.donation import BufferDonors
from xlasim.runtime.dynamic_dims import bounds
from xlasim.runtime.errors import xla_type
from xlasim.runtime.hbm import HBM, settle_all
from xlasim.runtime.metrics import Metrics
from xlasim.runtime.settings import xla_env_flag, xla_env_int
from xlasim.sharding import propagation
from xlasim.sharding.op_sharding import OpSharding
from xlasim.sharding.tensor_sharding import TensorSharding

_stable_ids: dict[Any, int] = {}


def stable_id(obj: Any) -> int:
    """A process-independent id for an op, dtype or string (``hash(str)`` is salted per
    process, so graph hashes are built from these and ints only)."""
    try:
        value = _stable_ids.get(obj)
    except TypeError:  # unhashable: identified by its text every time
        return zlib.crc32(str(obj).encode())
    if value is None:
        value = _stable_ids[obj] = zlib.crc32(str(obj).encode())
    return value


class Node:
    """A pending IR value: the op that makes a tensor and the values it consumes.

    ``call`` is set only while ops are recorded for a compiler (``RECORD_CALLS``): the op's
    arguments with each tensor replaced by an :class:`InputRef`, and which output this is.
    ``args`` keeps what the HLO text needs and the hash drops (a Python float's value): for an
    aten op its non-tensor positional arguments and its keyword arguments, for torch_xla's
    custom-sharding nodes a :class:`CustomCall`; None when not recorded. ``shape`` is the
    value's shape; ``sharding`` the TensorSharding the program annotated it with (a
    custom-sharding node of mark_sharding), which consumers see in propagation.
    """

    __slots__ = ("hash", "op", "inputs", "call", "args", "shape", "sharding", "loop")

    def __init__(
        self,
        hash_: int,
        op: Any,
        inputs: tuple[Any, ...],
        call: RecordedCall | None = None,
        args: Any = None,
        shape: tuple[int, ...] | None = None,
    ) -> None:
        self.hash = hash_
        self.op = op
        self.inputs = inputs
        self.call = call
        self.args = args
        self.shape = shape
        self.sharding: Any = None
        # (ScanLoop, output index) when the value is an output of scan's loop (scan_loop.py).
        self.loop: Any = None


class CustomCall:
    """torch_xla's ``CustomSharding`` IR node: an HLO custom-call to ``target`` whose output
    (of ``shape``) carries sharding ``spec``: its text, or the ``TensorSharding`` whose text it
    is (asked for only when the HLO text is written: an underived sharding has none); None
    once ``clear_sharding`` removed it from the node."""

    __slots__ = ("target", "spec", "shape")

    def __init__(self, target: str, spec: str | TensorSharding | None, shape: tuple[int, ...]):
        self.target = target
        self.spec = spec
        self.shape = shape

    def spec_text(self) -> str | None:
        spec = self.spec
        return spec if spec is None or isinstance(spec, str) else spec.spec_string()


class ManualCollective:
    """torch_xla's SPMD collective IR node inside a manual region (``_xla_spmd_all_reduce``,
    ``_xla_spmd_reduce_scatter``): XLA ``kind`` over the device-id ``groups``, scattering
    along ``dim`` (a reduce-scatter), its result multiplied by ``scale``."""

    __slots__ = ("kind", "reduce_type", "scale", "groups", "dim", "shape")

    def __init__(
        self,
        kind: str,
        reduce_type: str,
        scale: float,
        groups: list[list[int]],
        dim: int | None,
        shape: tuple[int, ...],
    ) -> None:
        self.kind, self.reduce_type, self.scale = kind, reduce_type, scale
        self.groups, self.dim, self.shape = groups, dim, shape


# Switched on by the TPU compiler layer: nodes then keep their op's arguments so the graph can
# be replayed for the compiler. Off, recording costs nothing.
RECORD_CALLS = False

# Set for good once any runtime turns eager mode on: until then the per-op path does not look
# up the active runtime's switch.
EAGER_SEEN = False


class InputRef:
    """A tensor argument of a recorded op: its position in ``Node.inputs``; for device data
    also the tensor (weakly: identity decides buffer donation) and its sharding then."""

    __slots__ = ("index", "tensor", "sharding")

    def __init__(self, index: int, tensor: Any = None, sharding: Any = None) -> None:
        self.index = index
        self.tensor = tensor
        self.sharding = sharding


@dataclass(frozen=True)
class RecordedCall:
    """One op call as recorded for one of its outputs (``index``); the outputs of one call
    share the same ``args`` tuple, which is how a replay runs the op once."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    index: int


class CompileError(RuntimeError):
    """A graph the real compiler rejected (e.g. one that does not fit a chip's HBM).

    The message is the compiler's status message without its code, as torch_xla 2.9 passes it
    on.  torch_xla raises it as ``RuntimeError`` from the aten ops that materialize a tensor
    (``.cpu()``, ``.item()``, printing) and as ``ValueError`` from its pybind functions
    (``torch_xla.sync()``, ``xm.mark_step()``): the simulated surface converts it there.
    """


class GraphCompiler(Protocol):
    """A real compiler the graphs also go to (implemented by ``runtime.compiler.libtpu``)."""

    def compile_graph(self, tensors: list[Any], key: int, site: str) -> CompiledGraph:
        """Compiles the graph materializing ``tensors`` unless graph ``key`` was compiled
        already; raises the compiler's error (e.g. a graph that does not fit)."""
        ...


class GraphDumper(Protocol):
    """Where each executed graph is written as it runs (``runtime.graph_dump``)."""

    def before_run(self, tensors: list[Any], key: int) -> str | None:
        """The text of the graph about to run for the pending ``tensors`` (None: no dump)."""
        ...

    def after_run(self, text: str, tensors: list[Any], spmd: bool) -> None:
        """Writes ``text`` once the graph ran (its outputs' shardings are known then)."""
        ...


@dataclass(frozen=True)
class CompiledGraph:
    """A real compiler's figures for one graph, per device (one device per chip on v4, v5e,
    v5p and v6e; two per chip on v2, v3 and v7x, each with half the chip's HBM)."""

    key: int
    """The graph hash (what the compile cache is keyed on)."""
    site: str
    """The user's line that cut the graph (sync, ``.cpu()``, ``.item()``...)."""
    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    """Output bytes written over an input buffer (donated parameters, optimizer state)."""
    temp_bytes: int
    generated_code_bytes: int
    flops: float
    """The compiler's own estimate (``cost_analysis``); it can count a loop body once."""
    bytes_accessed: float
    """HBM traffic, the compiler's own estimate."""
    compile_seconds: float
    trace_seconds: float
    """Turning the recorded graph into the compiler's input (replay and lowering)."""
    peak_flops_per_second: float
    """The device's share of its chip's peak bf16 FLOP/s (the slice model's figure)."""
    hbm_bytes_per_second: float
    """The device's share of its chip's HBM bandwidth."""
    hbm_bytes: int
    """HBM of one device."""
    output_shardings: tuple[OpSharding, ...] = ()
    """The sharding the compiler's propagation gave each output."""

    @property
    def peak_bytes(self) -> int:
        """HBM the program needs at once: its inputs, outputs not written over an input,
        temporaries and the program itself."""
        return (
            self.argument_bytes
            + self.output_bytes
            - self.alias_bytes
            + self.temp_bytes
            + self.generated_code_bytes
        )

    @property
    def step_seconds(self) -> float:
        """A roofline estimate: the larger of compute time at peak FLOP/s and HBM traffic at
        peak bandwidth.  A lower bound: no collectives, no slower f32 matmuls, perfect
        overlap, and the compiler's FLOP count."""
        return max(
            self.flops / self.peak_flops_per_second, self.bytes_accessed / self.hbm_bytes_per_second
        )


@dataclass(frozen=True)
class InputInfo:
    """A device-data input of a graph: what torch_xla keys a compiled graph on."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    sharding: str = ""

    def describe(self) -> str:
        text = f"shape {list(self.shape)} dtype {str(self.dtype).replace('torch.', '')}"
        return text + (f" sharding {self.sharding}" if self.sharding else "")


@dataclass
class GraphRecord:
    key: int
    site: str
    ops: tuple[str, ...]
    inputs: tuple[InputInfo, ...]
    num_outputs: int
    executions: int = 0
    # The mat-mul precision its float32 matmul-class ops were compiled at (None: it has none,
    # or they are exact).
    precision: str | None = None


@dataclass
class Recompilation:
    """A graph compiled at a site that had already compiled a different graph."""

    site: str
    previous: GraphRecord
    current: GraphRecord
    changes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        lines = [f"graph recompiled at {self.site}:"]
        lines += [f"  - {c}" for c in self.changes] or ["  - the traced ops differ"]
        return "\n".join(lines)


def _collect(outputs: Iterable[Node]) -> tuple[tuple[str, ...], tuple[InputInfo, ...]]:
    """Post-order walk of the pending graph: op names and device-data inputs, in order."""
    ops: list[str] = []
    inputs: list[InputInfo] = []
    seen: set[int] = set()
    stack: list[tuple[Any, bool]] = [(n, False) for n in reversed(list(outputs))]
    while stack:
        item, expanded = stack.pop()
        if isinstance(item, tuple):  # a device-data input: (shape, dtype, sharding)
            inputs.append(InputInfo(*item))
            continue
        if not isinstance(item, Node) or id(item) in seen:
            continue
        if expanded:
            seen.add(id(item))
            ops.append(str(item.op))
            continue
        stack.append((item, True))
        stack.extend((i, False) for i in reversed(item.inputs))
    return tuple(ops), tuple(inputs)


# Library frames a graph cut is never attributed to: the simulator, torch, and the seamless
# wrappers of ``tpu_backend`` (their ``optimizer.step()`` syncs on the user's behalf, so the
# user's call of it is the site worth reporting).
_XLASIM_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LIBRARY_DIRS = (
    _XLASIM_DIR + os.sep,
    os.path.dirname(torch.__file__) + os.sep,
    os.path.join(os.path.dirname(_XLASIM_DIR), "tpu_backend") + os.sep,
)


# What the numerics module tells the cache (it sits above this module): the mat-mul precision
# float32 matmul-class ops are computed at now (None where they are exact), and those ops.
def _exact() -> str | None:
    return None


_precision_now: Callable[[], str | None] = _exact
_precision_ops: frozenset[str] = frozenset()


def watch_precision(level_of: Callable[[], str | None], ops: Iterable[Any]) -> None:
    global _precision_now, _precision_ops
    _precision_now, _precision_ops = level_of, frozenset(str(op) for op in ops)


def _compiled_precision(record: GraphRecord) -> None:
    """A compiled graph keeps the precision in force when it was compiled: torch_xla reads it
    while lowering, and the graph hash does not cover it, so the cached graph runs at that
    precision after a change. The simulator computed the ops at the new one: say so."""
    now = _precision_now()
    if record.precision is None or now is None or now == record.precision:
        return
    raise NotImplementedError(
        f"xlasim does not simulate a cached graph keeping its mat-mul precision: this graph "
        f"was compiled at {record.precision!r} and is traced again at {now!r}; torch_xla "
        f"reuses the compiled graph (the precision is not in its hash) and computes at "
        f"{record.precision!r}, the simulator computed at {now!r}. Set the precision once, "
        "before the first device op"
    )


# torch_xla's in-memory compiled-graph cache holds XLA_COMPILATION_CACHE_SIZE graphs (LRU).
DEFAULT_COMPILATION_CACHE_SIZE = 2048


def _user_site() -> str:
    """The first frame outside the libraries: where the user's code cut the graph."""
    frame = sys._getframe(2)
    skip = _LIBRARY_DIRS
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(skip) and "importlib" not in filename:
            return f"{filename}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back  # type: ignore[assignment]
    return "<unknown>"


def user_site() -> str:
    """Where the user's code is now (the first frame outside the libraries)."""
    return _user_site()


def _same_input(now: InputInfo, compiled: InputInfo) -> bool:
    """Whether a program compiled for input ``compiled`` runs on ``now`` as it is: device
    data not annotated yet is taken replicated, what a step barrier would have made it."""
    if now == compiled:
        return True
    return (now.shape, now.dtype, now.sharding or "{replicated}") == (
        compiled.shape,
        compiled.dtype,
        compiled.sharding or "{replicated}",
    )


def _diff(previous: GraphRecord, current: GraphRecord) -> list[str]:
    changes = []
    for i, (old, new) in enumerate(zip(previous.inputs, current.inputs, strict=False)):
        if old != new:
            changes.append(f"input {i} changed from {old.describe()} to {new.describe()}")
    if len(previous.inputs) != len(current.inputs):
        changes.append(
            f"number of inputs changed from {len(previous.inputs)} to {len(current.inputs)}"
        )
    if previous.ops != current.ops:
        old_ops, new_ops = set(previous.ops), set(current.ops)
        added, removed = sorted(new_ops - old_ops), sorted(old_ops - new_ops)
        if added or removed:
            changes.append(f"ops changed: added {added or 'none'}, removed {removed or 'none'}")
        elif not changes:
            changes.append("the same ops were traced in a different order or count")
    if previous.num_outputs != current.num_outputs:
        changes.append(f"outputs changed from {previous.num_outputs} to {current.num_outputs}")
    return changes


class GraphCache:
    """Compiled-graph bookkeeping of one simulated process."""

    def __init__(self, metrics: Metrics, hbm: HBM) -> None:
        self._metrics = metrics
        self._hbm = hbm
        # LRU order, oldest first; bounded like torch_xla's memory cache once it is created.
        self.compiled: OrderedDict[int, GraphRecord] = OrderedDict()
        self._capacity: int | None = None
        self.last_at_site: dict[str, GraphRecord] = {}
        self.recompilations: list[Recompilation] = []
        # Graphs compiled by ``torch.compile``'s TorchTPU backend (torch_xla's counters do not
        # see them): the recompilation report counts them beside UncachedCompile.
        self.backend_compiles = 0
        # Tensors that got a pending node; dead references are dropped at the next sync.
        self.pending: list[weakref.ReferenceType[Any]] = []
        # Under SPMD, data moved from the host that an op used since the last step barrier.
        self.moved_in_use: list[weakref.ReferenceType[Any]] = []
        self.initialized = False
        # The real compiler every graph also goes to (``runtime.compiler.libtpu``), if any.
        self.compiler: GraphCompiler | None = None
        # Where executed graphs are written (XLA_SAVE_TENSORS_FILE), if anywhere.
        self.dump: GraphDumper | None = None
        # torch_xla's graph-executor switches: eager mode runs each op as its own graph;
        # ``torch_xla.compile(full_graph=True)`` forbids executing until its closing sync.
        self._use_eager_mode = False
        self.allow_execution = True
        self.graph_name = ""
        self.donors = BufferDonors()

    @property
    def traced_any(self) -> bool:
        """Whether ops have been traced: pending now, or in a graph compiled before."""
        return bool(self.pending or self.compiled)

    @property
    def use_eager_mode(self) -> bool:
        return self._use_eager_mode

    @use_eager_mode.setter
    def use_eager_mode(self, on: bool) -> None:
        global EAGER_SEEN
        self._use_eager_mode = on
        EAGER_SEEN = EAGER_SEEN or on

    # -- persistent cache --------------------------------------------------------------
    def _persistent_dir(self) -> tuple[str | None, bool]:
        path = os.environ.get("XLA_PERSISTENT_CACHE_PATH")
        readonly = os.environ.get("XLA_PERSISTENT_CACHE_READ_ONLY", "0") == "1"
        return path or None, readonly

    def _lookup(self, key: int) -> bool:
        """torch_xla's LookupCachedCompile with its PersistentCache in front of memory."""
        metrics = self._metrics
        self.initialized = True
        if key in self.compiled:
            self.compiled.move_to_end(key)
            metrics.inc("CachedCompile")
            return True
        path, _ = self._persistent_dir()
        if path is not None:
            os.makedirs(path, exist_ok=True)
            entry = self._entry(path, key)
            if os.path.exists(entry):
                start = time.perf_counter_ns()
                with open(entry, encoding="utf-8") as f:
                    json.load(f)
                metrics.add_sample("PersistentCacheLoad", time.perf_counter_ns() - start)
                metrics.inc("PersistentCacheHit")
                metrics.inc("CachedCompile")
                return True
            metrics.inc("PersistentCacheMiss")
        metrics.inc("UncachedCompile")
        return False

    @staticmethod
    def _entry(path: str, key: int) -> str:
        # torch_xla names an entry by its graph hash written as a decimal number.
        return os.path.join(path, str(key & (2**64 - 1)))

    def note_backend_compile(self, record: GraphRecord) -> None:
        """A graph ``torch.compile`` handed to a backend of ours (TorchTPU's ``"tpu"``): a
        recompilation where its site had compiled a different graph before."""
        self.backend_compiles += 1
        self._note_recompilation(record)
        self.last_at_site[record.site] = record

    def _note_recompilation(self, record: GraphRecord) -> None:
        """A newly compiled ``record`` is a recompilation where its site compiled another graph
        last."""
        previous = self.last_at_site.get(record.site)
        if previous is not None and previous.key != record.key:
            self.recompilations.append(
                Recompilation(record.site, previous, record, _diff(previous, record))
            )

    def _store(self, record: GraphRecord) -> None:
        if self._capacity is None:
            # Read once, when the cache is created, as torch_xla does.
            self._capacity = xla_env_int(
                "XLA_COMPILATION_CACHE_SIZE", DEFAULT_COMPILATION_CACHE_SIZE
            )
        self.compiled[record.key] = record
        self.compiled.move_to_end(record.key)
        while len(self.compiled) > max(self._capacity, 0):
            self.compiled.popitem(last=False)
        path, readonly = self._persistent_dir()
        if path is None or readonly:
            return
        entry = self._entry(path, record.key)
        if not os.path.exists(entry):
            tmp = f"{entry}.{os.getpid()}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump({"site": record.site, "ops": list(record.ops)}, f)
            os.replace(tmp, entry)

    # -- execution ---------------------------------------------------------------------
    def live_pending(self) -> list[Any]:
        seen: set[int] = set()
        live = []
        for ref in self.pending:
            t = ref()
            if t is not None and t._node is not None and id(t) not in seen:
                seen.add(id(t))
                live.append(t)
        live.sort(key=lambda t: t._seq)
        return live

    def execute(
        self,
        tensors: list[Any],
        *,
        sync_all: bool,
        spmd: bool,
        eager: bool = False,
        donate_ltc: bool | None = None,
    ) -> None:
        """Compiles (or reuses) and "runs" the graph that materializes ``tensors``.

        With a real compiler attached, a graph it has not compiled yet goes to it first; a
        compile error (a graph that does not fit) leaves the tensors pending, as a failed
        sync does in torch_xla. ``eager``: one op's own graph, run as eager mode does (torch_xla
        times those under the EagerOp* metrics). While execution is forbidden (inside
        ``torch_xla.compile(full_graph=True)``) a graph to run raises torch_xla's RuntimeError
        and leaves the tensors pending. ``donate_ltc`` (by default ``sync_all``): whether the
        buffers of tensors updated in place are donated, as at torch_xla's step barrier.
        """
        tensors = [t for t in tensors if t._node is not None]
        if not tensors:
            if sync_all:
                self.pending = []
            return
        if not self.allow_execution:
            raise _unexpected_execution(self.graph_name, len(tensors))
        if donate_ltc is None:
            donate_ltc = sync_all
        start = time.perf_counter_ns()
        nodes = [t._node for t in tensors]
        key = hash(tuple(n.hash for n in nodes))
        inputs: list[Any] = []
        user_donors: list[int] = []
        if self.donors.marked or self.donors.deleted:
            inputs = _graph_inputs(nodes)
            self._check_not_deleted(inputs)
            if _aliasing_on() and (donate_ltc or self.donors.user_config):
                user_donors = self.donors.donors(inputs)
                if user_donors:
                    # torch_xla hashes the donated positions: those of the buffers of tensors
                    # updated in place (at a step barrier) with the marked ones.
                    own = _updated_keys(tensors) if donate_ltc else set()
                    updated = {i for i, k in enumerate(inputs) if id(k) in own}
                    key = hash((key, tuple(sorted(updated.union(user_donors)))))
        if key in self.compiled:
            _compiled_precision(self.compiled[key])
        cached = self._lookup(key)
        site = _user_site()
        analyzed = debug_analysis.level() > 0
        if analyzed and not cached:
            self._analyze(debug_analysis.COMPILATION, key, nodes)
        output_shardings = None
        compiled = None
        if self.compiler is not None:
            compiled = self.compiler.compile_graph(tensors, key, site)
            output_shardings = compiled.output_shardings
        if sync_all:
            self.pending = []
        aliases = _alias_count(tensors, donate_ltc, [inputs[i] for i in user_donors])
        record = self._record(tensors, nodes, key, cached, site, start, eager, aliases)
        self.last_at_site[site] = record
        if analyzed:
            if not cached:
                self._post_compilation(key, record, tensors, compiled)
            self._analyze(debug_analysis.EXECUTION, key, nodes)
        dumped = self.dump.before_run(tensors, key) if self.dump is not None else None
        self._run(record, tensors, spmd, start, eager, output_shardings, counted=True)
        if dumped is not None:
            assert self.dump is not None
            self.dump.after_run(dumped, tensors, spmd)
        if inputs:
            self.donors.donate(inputs, user_donors)
            for t in tensors:
                if t._leaf is not None:
                    self.donors.replaced(t._leaf[1])
                    t._leaf = None  # new data: a key object of its own

    def _check_not_deleted(self, inputs: list[Any]) -> None:
        """A graph reading a donated (deleted) buffer fails, with PJRT's check."""
        for key in inputs:
            device = self.donors.deleted_on(key)
            if device is not None:
                shape, dtype = key[0], key[1]
                text = f"{xla_type(dtype)}[{','.join(map(str, shape))}]"
                raise RuntimeError(
                    f"Check failed: !buffer->IsDeleted(): buffer with shape {text} on device "
                    f"{device} is deleted"
                )

    def warm_up(self, tensors: list[Any]) -> int | None:
        """Compiles (or finds in the cache) the graph that materializes ``tensors`` without
        running it, as torch_xla's ``_xla_warm_up_cache`` does; returns its key (None when
        nothing is pending). The tensors stay pending."""
        tensors = [t for t in tensors if t._node is not None]
        if not tensors:
            return None
        start = time.perf_counter_ns()
        nodes = [t._node for t in tensors]
        key = hash(tuple(n.hash for n in nodes))
        cached = self._lookup(key)
        site = _user_site()
        analyzed = debug_analysis.level() > 0 and not cached
        if analyzed:
            self._analyze(debug_analysis.COMPILATION, key, nodes)
        compiled = None
        if self.compiler is not None:
            compiled = self.compiler.compile_graph(tensors, key, site)
        record = self._record(tensors, nodes, key, cached, site, start, False, 0)
        self.last_at_site[site] = record
        if analyzed:
            self._post_compilation(key, record, tensors, compiled)
        return key

    # -- PT_XLA_DEBUG ------------------------------------------------------------------------
    def _analyze(
        self, prefix: str, key: int, nodes: list[Node], dynamo_execution: bool = False
    ) -> None:
        debug_analysis.graph_analysis(
            prefix,
            key,
            debug_analysis.count_inputs(nodes),
            len(nodes),
            self.graph_name,
            self.use_eager_mode,
            dynamo_execution,
        )

    def _post_compilation(
        self, key: int, record: GraphRecord, tensors: list[Any], compiled: CompiledGraph | None
    ) -> None:
        if compiled is not None:
            sizes: tuple[int | None, ...] = (
                compiled.argument_bytes,
                compiled.output_bytes,
                compiled.alias_bytes,
                compiled.temp_bytes,
                compiled.generated_code_bytes,
            )
        else:
            # Without a real compiler only the inputs' and outputs' sizes are known.
            inputs = sum(_nbytes(i.shape, i.dtype) for i in record.inputs)
            outputs = sum(_nbytes(bounds(t.shape), t.dtype) for t in tensors)
            sizes = (inputs, outputs, None, None, None)
        debug_analysis.post_compilation_analysis(key, sizes, self.use_eager_mode)

    def run_cached(self, tensors: list[Any], key: int, *, spmd: bool) -> None:
        """Runs compiled graph ``key`` for ``tensors`` (the same program traced again on the
        new inputs), as torch_xla's ``_run_cached_graph`` does: no cache lookup, so neither
        ``CachedCompile`` nor the execution counters move, only the execution time metric."""
        record = self.compiled.get(key)
        tensors = [t for t in tensors if t._node is not None]
        if record is None:
            raise RuntimeError(
                f"the compiled graph {key} is not in the compilation cache any more "
                "(XLA_COMPILATION_CACHE_SIZE evicted it)"
            )
        if key != hash(tuple(t._node.hash for t in tensors)):
            ops, inputs = _collect([t._node for t in tensors])
            if ops != record.ops or not all(map(_same_input, inputs, record.inputs)):
                raise RuntimeError(
                    f"the compiled graph {key} was compiled for other inputs: "
                    + "; ".join(_diff(record, GraphRecord(key, "", ops, inputs, len(tensors))))
                )
        self.compiled.move_to_end(key)
        if debug_analysis.level() > 0:
            nodes = [t._node for t in tensors]
            self._analyze(debug_analysis.EXECUTION, key, nodes, dynamo_execution=True)
        output_shardings = None
        if self.compiler is not None:
            output_shardings = self.compiler.compile_graph(
                tensors, key, record.site
            ).output_shardings
        self._run(
            record, tensors, spmd, time.perf_counter_ns(), False, output_shardings, counted=False
        )

    def _record(
        self,
        tensors: list[Any],
        nodes: list[Node],
        key: int,
        cached: bool,
        site: str,
        start: int,
        eager: bool,
        aliases: int,
    ) -> GraphRecord:
        """The cache's record of graph ``key``; a new one is compiled (and timed) here."""
        record = self.compiled.get(key) if cached else None
        if record is None:
            ops, inputs = _collect(nodes)
            record = GraphRecord(key, site, ops, inputs, len(nodes))
            if _precision_ops.intersection(ops):
                record.precision = _precision_now()
            if not cached:
                self._note_recompilation(record)
            self._store(record)
            if not cached:
                self._metrics.add_sample("InputOutputAliasCount", aliases)
                self._metrics.add_sample(
                    "EagerOpCompileTime" if eager else "CompileTime", time.perf_counter_ns() - start
                )
                self._metrics.inc("CreateCompileHandles")  # the runtime's compiled executable
        return record

    def _run(
        self,
        record: GraphRecord,
        tensors: list[Any],
        spmd: bool,
        start: int,
        eager: bool,
        output_shardings: tuple[OpSharding, ...] | None,
        *,
        counted: bool,
    ) -> None:
        """The compiled program runs: its outputs become device data."""
        metrics = self._metrics
        record.executions += 1
        if spmd:
            _settle_output_shardings(tensors, output_shardings)
            # torch_xla sets each output's sharding spec from the executed program's, sharded
            # or replicated (measured on torch_xla 2.9: one SetShardingSpec per output).
            metrics.inc("SetShardingSpec", len(tensors))
        # The program's outputs become device buffers (or the execution runs out of HBM).
        settle_all(self._hbm, spmd, tensors)
        for t in tensors:
            t._node = None
            t._aliased = False
            t._computed = True
        # PJRT counts an SPMD (virtual device) program as a replicated execution.
        if spmd:
            if counted:
                metrics.inc("ExecuteReplicated")
            metrics.add_sample("ExecuteReplicatedTime", time.perf_counter_ns() - start)
        else:
            if counted:
                metrics.inc("ExecuteComputation")
            metrics.add_sample(
                "EagerOpExecuteTime" if eager else "ExecuteTime", time.perf_counter_ns() - start
            )

    def settle_moved_data(self) -> None:
        """At a step barrier, moved data that an op used since the previous one becomes
        replicated device data: torch_xla's barrier syncs its ``device_data`` IR value,
        uploading it replicated, whether or not the op's result is still alive (measured on
        torch_xla 2.9: ``''`` before the barrier, ``'{replicated}'`` after). Data sharded or
        updated in place meanwhile keeps what it got."""
        for ref in self.moved_in_use:
            t = ref()
            if t is None or t._node is not None or t._computed:
                continue
            if t._sharding is None or t._spec_on_ir:
                if t._sharding is None:
                    t._sharding = TensorSharding(OpSharding.replicated(), tuple(t.shape))
                t._spec_on_ir = False
                # Used before any barrier uploaded it, its IR value is now plain device data;
                # uploaded by an earlier barrier, torch_xla keeps the device_data IR value.
                t._computed = t._moved_at is None or t._moved_at == t._uploaded_at
        self.moved_in_use = []


_UNEXPECTED = "Unexpected Execution Analysis: "


def _unexpected_execution(graph_name: str, outputs: int) -> RuntimeError:
    """torch_xla's error for a graph executed where ``torch_xla.compile(full_graph=True)``
    forbids it; the analysis it prints first says where, so the user can find the culprit."""
    lines = ["", "=" * 80, "Execution Cause", "  user code needs a tensor's value (or a sync)"]
    lines.append("Graph Info: ")
    if graph_name:
        lines.append(f"  Graph Name: {graph_name}")
    lines += [f"  Number of Graph Outputs: {outputs}", "Python Frame Triggered Execution: "]
    lines += [f"  {site}" for site in _python_frames(8)]
    lines += ["-" * 80, "=" * 80]
    print("\n".join(_UNEXPECTED + line if line else line for line in lines), file=sys.stderr)
    return RuntimeError("Unexpected execution happens inside the compiled function, exiting\n")


def _python_frames(limit: int) -> list[str]:
    """The innermost ``limit`` Python frames outside the libraries, as 'function (file:line)'."""
    frames: list[str] = []
    frame = sys._getframe(1)
    while frame is not None and len(frames) < limit:
        code = frame.f_code
        if not code.co_filename.startswith(_LIBRARY_DIRS):
            frames.append(f"{code.co_name} ({code.co_filename}:{frame.f_lineno})")
        frame = frame.f_back  # type: ignore[assignment]
    return frames


def _nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    n = dtype.itemsize
    for d in shape:
        n *= d
    return n


def _aliasing_on() -> bool:
    return xla_env_flag("XLA_ENABLE_PARAM_ALIASING", "1")


def _alias_count(tensors: list[Any], step_barrier: bool, user_donors: list[Any]) -> int:
    """How many input buffers a newly compiled program donates to its outputs.

    torch_xla donates the device data of tensors updated in place, only at a step barrier
    (``torch_xla.sync()``: a sync for ``.cpu()`` still needs the old values), unless
    ``XLA_ENABLE_PARAM_ALIASING`` is off. Rank-0 tensors do not donate (measured on torch_xla
    2.9: 0 for a 0-dim ``+=``, 1 for ranks 1 and 2, created on or moved to the device).
    Buffers user code marked (``user_donors``, their keys) add to those, each buffer once.
    """
    if not _aliasing_on():
        return 0
    updated = [t for t in tensors if t._aliased and t.dim() > 0] if step_barrier else []
    own = _updated_keys(updated)
    return len(updated) + sum(1 for key in user_donors if id(key) not in own)


def _updated_keys(tensors: list[Any]) -> set[int]:
    """The buffers (their key objects' ids) that tensors updated in place held before."""
    return {id(t._leaf[1]) for t in tensors if t._aliased and t.dim() > 0 and t._leaf is not None}


def _graph_inputs(nodes: list[Node]) -> list[Any]:
    """The distinct device-data inputs (their keys) of the graph computing ``nodes``, in the
    order the graph first reads them."""
    inputs: list[Any] = []
    seen: set[int] = set()
    stack: list[Any] = list(reversed(nodes))
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        if isinstance(item, tuple):
            seen.add(id(item))
            inputs.append(item)
        elif isinstance(item, Node):
            seen.add(id(item))
            stack.extend(reversed(item.inputs))
    return inputs


def _settle_output_shardings(
    tensors: list[Any], compiled: tuple[OpSharding, ...] | None = None
) -> None:
    """Graph outputs of an SPMD program carry the sharding XLA gave them.

    When a real compiler compiled the graph, that is its choice (``compiled``, one per
    output), which is where torch_xla takes it from.  Otherwise the simulator, which does not
    run XLA's sharding propagation, gives outputs the sharding real torch_xla reports where
    that can be derived exactly (replicated when nothing upstream is sharded, the input's for
    elementwise ops, replicated for rank 0). Anything else becomes an ``UnderivedSharding``:
    computed as replicated, but asking for its spec raises NotImplementedError instead of
    inventing one. Tensors updated in place, or annotated, keep theirs.
    """
    if compiled is not None:
        for t, chosen in zip(tensors, compiled, strict=True):
            if t._sharding is None:
                t._sharding = TensorSharding(chosen, tuple(t.shape))
        return
    # One propagation for the whole graph: its outputs share most of their upstream values.
    settle = propagation.Propagation()
    for t in tensors:
        if t._sharding is None and t._aliased:
            # Updated in place: XLA aliases the input buffer, and an unannotated SPMD input
            # is replicated (how real torch_xla reports parameters after an optimizer step).
            t._sharding = TensorSharding(OpSharding.replicated(), tuple(t.shape))
        elif t._sharding is None:
            sharding = settle.output_sharding(t)
            if sharding is propagation.UNKNOWN:
                sharding = UnderivedSharding(OpSharding.replicated(), tuple(t.shape))
            t._sharding = sharding


class UnderivedSharding(TensorSharding):
    """An SPMD graph output's sharding that only XLA's propagation could tell."""

    __slots__ = ()

    def spec_string(self) -> str:
        raise NotImplementedError(
            "xlasim does not simulate XLA's sharding propagation: the sharding real torch_xla "
            f"reports for this graph output (shape {list(self.shape)}) is GSPMD's choice; "
            "annotate the tensor with mark_sharding to fix it"
        )

    def __repr__(self) -> str:
        return f"UnderivedSharding(shape={self.shape})"
