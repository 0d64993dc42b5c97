"""The simulated slice as seen by this process.

One ``SimRuntime`` is active at a time (a stack, for nested ``simulate()``); everything the
simulated ``torch_xla`` modules report is derived from it, so a fresh runtime means fresh state.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from tpu_backend.topology import SliceSpec, check_num_slices, check_slice_index, tpu_host_env
from xlasim.runtime.client import Client, client_from_env
from xlasim.runtime.coordinator import Coordinator
from xlasim.runtime.graph import GraphCache
from xlasim.runtime.hbm import HBM
from xlasim.runtime.metrics import Metrics
from xlasim.runtime.scalar_data import ScalarData
from xlasim.runtime.settings import (
    MAT_MUL_PRECISION_ENV,
    NUMERICS,
    NUMERICS_ENV,
    PRECISIONS,
    env_choice,
    xla_env_flag,
)

# Environment variables torch_xla itself reads or writes; saved on activation and restored on
# deactivation so a simulation never leaks its SPMD mode or cache settings into the caller.
TORCH_XLA_ENV = (
    "XLA_USE_SPMD",
    "XLA_AUTO_SPMD",
    "XLA_PERSISTENT_CACHE_PATH",
    "XLA_PERSISTENT_CACHE_READ_ONLY",
    "PJRT_DEVICE",
    # What xmp.spawn's launcher sets for a process that owns one chip.
    "PJRT_LOCAL_PROCESS_RANK",
    "PJRT_LOCAL_PROCESS_COUNT",
    "TPU_VISIBLE_CHIPS",
    "TPU_CHIPS_PER_PROCESS_BOUNDS",
    "TPU_PROCESS_BOUNDS",
    "TPU_PROCESS_ADDRESSES",
    "TPU_PROCESS_PORT",
    "CLOUD_TPU_TASK_ID",
    # What a multislice job's hosts get (tpu_backend.topology.megascale_env).
    "MEGASCALE_COORDINATOR_ADDRESS",
    "MEGASCALE_PORT",
    "MEGASCALE_NUM_SLICES",
    "MEGASCALE_SLICE_ID",
)


@dataclass
class HostLink:
    """The gloo group this process shares with the slice's other simulated hosts."""

    group: Any
    """A ``torch.distributed.ProcessGroupGloo``."""
    store: Any
    """The ``TCPStore`` under the group, kept alive as long as the group."""
    timeout_s: float
    """How long meeting the other hosts and each exchange may wait."""


@dataclass(eq=False)  # one runtime is one process's state: compared by identity
class SimRuntime:
    """Everything one simulated process knows about its slice and its own state."""

    spec: SliceSpec
    host_index: int = 0
    """This host's place in its slice (its ``TPU_WORKER_ID``)."""
    num_slices: int = 1
    """Slices of ``spec`` joined over DCN (a multislice job); each has ``spec``'s hosts."""
    slice_index: int = 0
    """Which of them this host belongs to (its ``MEGASCALE_SLICE_ID``)."""
    _default_devices: threading.local = field(
        default_factory=threading.local, init=False, repr=False
    )
    _last_default_index: int = field(default=0, init=False, repr=False)
    device_threads: int = 0
    """How many device threads xmp.spawn runs in this process now (0 outside such a run)."""
    step_closures: list[tuple[bool, Callable[..., Any], tuple[Any, ...]]] = field(
        default_factory=list
    )
    """(run_async, closure, args), queued by xm.add_step_closure and run after a sync."""
    async_closures: Any = None
    """torch_xla.utils.closures.AsyncClosureHandler running the asynchronous step closures,
    made at the first one."""
    replication_devices: int = 0
    """0 means "not replicated", which is what world_size() reads."""
    world_size: int | None = None
    """``xr.world_size()`` once asked: torch_xla keeps its first answer for the process."""
    devices_used: bool = False
    """Set once a tensor lives on a device: torch_xla then calls the SPMD config locked."""
    rng_seed: int = 0
    """The running seed (``xm.get_rng_state()``): moved on by each random op."""
    rng_base: int = 0
    """The step's base seed (``_get_base_seed_as_tensor``): moved on by each step barrier."""
    device_contexts: dict[str, Any] = field(default_factory=dict)
    """``xm``'s per-device context objects, by device name."""
    memory: HBM = field(init=False)
    """Per-chip HBM: the live device buffers (``xlasim.runtime.memory``)."""
    hosts: HostLink | None = None
    """Joined on first use, on multi-host slices only."""
    replicas: HostLink | None = None
    """The group of the processes ``xmp.spawn`` started, joined at the first collective."""
    global_mesh: Any = None
    """``xs.set_global_mesh``'s mesh (per process in torch_xla, so per runtime here)."""
    single_process: bool = False
    """This process stands for every host of the slice: the absent hosts enter the same data
    into their devices as this one does, so no other process is needed."""
    dry_run: bool = False
    """Shape-only values (meta tensors): see ``xlasim.runtime.dry_run``."""
    metrics: Metrics = field(default_factory=Metrics)
    step_barriers: int = 0
    """How many ``torch_xla.sync()`` step barriers this runtime has passed."""
    coordinator: Coordinator = field(default_factory=Coordinator)
    """The distributed-runtime coordinator and its preemption sync manager."""
    mat_mul_precision: str = field(
        default_factory=lambda: env_choice(MAT_MUL_PRECISION_ENV, PRECISIONS, PRECISIONS[0])
    )
    """torch_xla's mat-mul precision for 32-bit inputs (``torch_xla.backends``); a process-wide
    C++ setting in torch_xla, so one per runtime here, starting at torch_xla's default unless
    ``XLASIM_MAT_MUL_PRECISION`` names another."""
    traced_runs: dict[bytes, Any] = field(default_factory=dict)
    """Graphs ``_xla_warm_up_cache`` compiled, by graph hash, for ``_run_cached_graph``
    (``xlasim.runtime.graph_inputs.TracedRun``)."""
    numerics: str = field(default_factory=lambda: env_choice(NUMERICS_ENV, NUMERICS, NUMERICS[0]))
    """``XLASIM_NUMERICS`` when the simulation started: ``tpu`` or ``exact``."""
    float_storage: str | None = None
    """How the devices store floating values: ``""`` as their dtype, or the legacy bfloat16
    variable in force (``xlasim.runtime.legacy_bf16``); None until the first floating tensor."""
    long_storage: bool | None = None
    """Whether the devices hold 64-bit integers in 32 bits (``XLA_USE_32BIT_LONG``,
    ``xlasim.runtime.legacy_long``); None until the first 64-bit integer tensor."""
    graphs: GraphCache = field(init=False)
    scalar_data: ScalarData = field(default_factory=ScalarData)
    """The device data torch_xla has moved for Python numbers ops took (a cache)."""
    generator: torch.Generator = field(init=False)
    _client: Client | None = field(default=None, init=False, repr=False)
    _client_failure: Exception | None = field(default=None, init=False, repr=False)
    """Why the client could not be created: torch_xla keeps that answer for the process."""
    _saved_env: dict[str, str | None] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        tpu_host_env(self.spec, self.host_index)  # the slice model's host-index check
        check_num_slices(self.num_slices)
        check_slice_index(self.slice_index, self.num_slices)
        self.memory = HBM(self.spec, self.num_slices)
        self.graphs = GraphCache(self.metrics, self.memory)
        self.generator = torch.Generator().manual_seed(self.rng_seed)

    # -- environment ---------------------------------------------------------------------
    def save_env(self) -> None:
        self._saved_env = {k: os.environ.get(k) for k in TORCH_XLA_ENV}

    def restore_env(self, saved: dict[str, str | None] | None = None) -> None:
        """Puts back the variables as :meth:`save_env` found them (or as ``saved`` has them)."""
        for key, value in (self._saved_env if saved is None else saved).items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    @property
    def saved_env(self) -> dict[str, str | None]:
        return dict(self._saved_env)

    def describe(self) -> str:
        where = f"slice {self.slice_index} of {self.num_slices}, " if self.num_slices > 1 else ""
        return f"{self.spec.pod_type} ({self.spec.topology}), {where}host {self.host_index}"

    # -- device model --------------------------------------------------------------------
    @property
    def spmd(self) -> bool:
        # torch_xla decides SPMD from the environment flag, so a user setting it directly
        # is honoured exactly as on the real runtime.
        return xla_env_flag("XLA_USE_SPMD")

    @property
    def client(self) -> Client:
        """The PJRT client, created from the environment on first use as torch_xla does."""
        if self._client is None:
            self.start()
        assert self._client is not None
        return self._client

    @property
    def client_initialized(self) -> bool:
        return self._client is not None

    def start(self, client: Client | None = None) -> None:
        """What starts torch_xla's runtime (a device named or used) creates the client:
        ``client``, or the one the environment names."""
        if self._client is None:
            if self._client_failure is not None:
                # Every later start fails the same way, whatever the environment says now.
                raise self._client_failure.with_traceback(None)
            for hook in START_HOOKS:
                hook(self)
            try:
                self._client = client or client_from_env(
                    self.spec,
                    self.host_index,
                    num_slices=self.num_slices,
                    slice_index=self.slice_index,
                )
            except Exception as e:
                self._client_failure = e
                raise
            if not self._client.is_tpu:
                self.memory.host_memory(self._client.num_devices)

    @property
    def default_device_index(self) -> int:
        """The index of this thread's default device: torch_xla keeps the current device per
        thread, and a thread that never set one uses xla:0."""
        index = getattr(self._default_devices, "index", None)
        if index is not None:
            return int(index)
        if isinstance(threading.current_thread(), threading._DummyThread):
            # A thread torch started (autograd's per-device threads): torch_xla's device guard
            # gives it the device it serves, which the simulator's guard does not tell.
            if self.device_threads > 1:
                raise NotImplementedError(
                    "xlasim does not simulate the current device of a thread torch started (an "
                    "autograd device thread) while xmp.spawn runs one thread per device"
                )
            return self._last_default_index  # the device a one-device program set
        return 0

    @default_device_index.setter
    def default_device_index(self, index: int) -> None:
        self._default_devices.index = index
        self._last_default_index = index

    @property
    def device_type(self) -> str:
        return self.client.device_type

    def global_device_ids(self) -> list[int]:
        return self.client.global_ids()

    def addressable_device_ids(self) -> list[int]:
        return self.client.local_ids()

    def real_devices(self) -> list[str]:
        """The process's runtime devices, named by global id as PJRT names them."""
        client = self.client
        return [f"{client.device_type}:{i}" for i in client.local_ids()]

    def xla_devices(self) -> list[str]:
        """What ``_XLAC._xla_get_devices`` lists: one virtual device under SPMD."""
        devices = self.real_devices()
        return devices[:1] if self.spmd else devices

    def default_ordinal(self) -> int:
        """The global ordinal of this process's default device."""
        return self.addressable_device_ids()[0] + self.default_device_index

    # -- execution -----------------------------------------------------------------------
    def mark_step(self) -> None:
        """A step boundary: every live tensor's pending graph runs (one graph), counted."""
        self.graphs.execute(self.graphs.live_pending(), sync_all=True, spmd=self.spmd)
        self.graphs.settle_moved_data()
        self.metrics.inc("MarkStep")
        self.step_barriers += 1
        # Each step barrier moves the base seed on and the running seed restarts from it,
        # whether or not the step drew random numbers (torch_xla 2.9's constants, as measured
        # through ``xm.get_rng_state()``).
        self.rng_base = (self.rng_base * 7012063 + 1012031) % 2**64
        self._seed(self.rng_base)

    def manual_seed(self, seed: int) -> None:
        self.rng_base = int(seed) % 2**64
        self._seed(self.rng_base)

    def random_generator(self) -> torch.Generator:
        """The generator one random op draws from. torch_xla moves the running seed on for
        each such op (constants measured through ``xm.get_rng_state()``); in eager mode the
        op runs at once, and the base seed follows. The values drawn are a function of the
        seed, so ``xm.set_rng_state`` with a seed read before a draw repeats it."""
        self._seed((self.rng_seed * 214013 + 2531011) % 2**64)
        if self.graphs.use_eager_mode:
            self.rng_base = self.rng_seed
        return self.generator

    def _seed(self, seed: int) -> None:
        # One generator for the whole slice: every device draws the same stream.
        self.rng_seed = seed
        self.generator.manual_seed(seed)


@dataclass
class ProcessState:
    """What real torch_xla keeps per process rather than per runtime.

    The simulated modules are re-imported for every simulation, so their module globals
    cannot hold it.
    """

    rendezvous_store: Any = None
    """The ``xla://`` rendezvous ``TCPStore``: it listens on a port, so one per process."""


PROCESS = ProcessState()

START_HOOKS: list[Callable[[SimRuntime], None]] = []
"""Run before a runtime's client is created (its first device use); one may refuse by raising."""

_stack: list[SimRuntime] = []


def current() -> SimRuntime:
    if not _stack:
        raise RuntimeError(
            "xlasim: no simulated TPU slice is active in this process; use "
            "`with xlasim.simulate(topology=...)`, `xlasim run`, or set XLASIM_TOPOLOGY"
        )
    return _stack[-1]


def active() -> SimRuntime | None:
    return _stack[-1] if _stack else None


def count(name: str) -> None:
    """A torch_xla counter (``TORCH_LAZY_COUNTER``) on the active runtime, if any."""
    if _stack:
        _stack[-1].metrics.inc(name)


def outermost() -> SimRuntime | None:
    return _stack[0] if _stack else None


def push(runtime: SimRuntime) -> None:
    _stack.append(runtime)


def pop(runtime: SimRuntime) -> None:
    if not _stack or _stack[-1] is not runtime:
        raise RuntimeError("xlasim: simulations must be exited in the reverse order of entry")
    _stack.pop()
