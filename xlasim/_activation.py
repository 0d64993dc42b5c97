"""Import redirection: inside a simulation, ``import torch_xla`` and ``import torch_tpu`` give the
simulated modules.

The simulated module tree lives in ``xlasim/torch_xla`` and is imported under the real names
(``torch_xla.runtime``...), so tracebacks, pickling and ``__name__`` checks look as they would
with the real package. Activation is a stack: the outermost entry swaps the modules in, the
outermost exit puts back whatever ``torch_xla`` modules were there before.
"""

from __future__ import annotations

import atexit
import functools
import importlib.abc
import importlib.machinery
import importlib.metadata
import os
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

from tpu_backend.machine import real_torch_xla_loaded
from tpu_backend.topology import (
    SliceSpec,
    check_num_slices,
    check_slice_index,
    parse_slice,
    tpu_host_env,
)
from xlasim.runtime.settings import (
    REPORT_ENV,
    EnvError,
    check_runtime_knobs,
    env_int,
    resolve_compiler,
    resolve_dry_run,
)
from xlasim.runtime.unsimulated import UnsimulatedModule

_SURFACE_PARENT = os.path.dirname(os.path.abspath(__file__))
_lock = threading.RLock()

F = TypeVar("F", bound=Callable[..., Any])
# "1": one process stands for every host of a multi-host slice (see simulate(single_process=)).
SINGLE_PROCESS_ENV = "XLASIM_SINGLE_PROCESS"


def _is_torch_xla(name: str) -> bool:
    return name == "torch_xla" or name.startswith("torch_xla.")


def _is_torch_tpu(name: str) -> bool:
    return name == "torch_tpu" or name.startswith("torch_tpu.")


def _is_simulated(name: str) -> bool:
    """A module of a surface the simulator serves: torch_xla's or TorchTPU's."""
    return _is_torch_xla(name) or _is_torch_tpu(name)


SIMULATED_VERSION = "2.9.0"
"""The torch_xla release the simulated surface mirrors (also ``torch_xla.version.__version__``)."""

SIMULATED_TORCH_TPU_VERSION = "0.2.0"
"""The TorchTPU release the simulated ``torch_tpu`` mirrors."""


class _SimulatedDistribution(importlib.metadata.Distribution):
    """The installed-package record of a simulated package (torch_xla, or TorchTPU).

    Client libraries decide what torch_xla can do from its distribution's version (Lightning's
    ``RequirementCache("torch_xla>=2.1")``, ``importlib.metadata.version("torch_xla")``), before
    and without importing it.
    """

    def __init__(self, name: str = "torch-xla", version: str = SIMULATED_VERSION) -> None:
        self._metadata = f"Metadata-Version: 2.4\nName: {name}\nVersion: {version}\n"

    def read_text(self, filename: str) -> str | None:
        return self._metadata if filename == "METADATA" else None

    def locate_file(self, path: Any) -> Any:
        return os.path.join(_SURFACE_PARENT, str(path))


def _simulated_distributions(context: Any) -> list[importlib.metadata.Distribution]:
    name = getattr(context, "name", None)
    wanted = None if name is None else name.replace("-", "_").lower()
    found: list[importlib.metadata.Distribution] = []
    if wanted in (None, "torch_xla"):
        found.append(_SimulatedDistribution())
    if wanted in (None, "torch_tpu"):
        found.append(_SimulatedDistribution("torch-tpu", SIMULATED_TORCH_TPU_VERSION))
    return found


class _SimFinder(importlib.abc.MetaPathFinder):
    def find_distributions(self, context: Any = None) -> list[importlib.metadata.Distribution]:
        return _simulated_distributions(context)

    def find_spec(self, fullname: str, path: Any = None, target: ModuleType | None = None):
        if not _is_simulated(fullname):
            return None
        if fullname in ("torch_xla", "torch_tpu"):
            spec = importlib.machinery.PathFinder.find_spec(fullname, [_SURFACE_PARENT])
        else:
            parent = sys.modules.get(fullname.rpartition(".")[0])
            search = list(getattr(parent, "__path__", []) or [])
            spec = importlib.machinery.PathFinder.find_spec(fullname, search) if search else None
        if spec is None:
            package, doc = (
                ("TorchTPU", "docs/torch-tpu.md")
                if _is_torch_tpu(fullname)
                else ("torch_xla", "docs/support-matrix.md")
            )
            # No ``name``: ``from torch_xla.x import module`` drops a ModuleNotFoundError
            # that names the module it imports and says only "cannot import name"; without it
            # the error that says what is not simulated reaches the program.
            raise UnsimulatedModule(
                f"No module named {fullname!r}: xlasim does not simulate this part of "
                f"{package} ({doc} lists what it does)"
            )
        return spec


class _LazyFinder(importlib.abc.MetaPathFinder):
    """Installed by environment activation: activates on the first ``import torch_xla`` (or
    ``import torch_tpu``).

    Keeps interpreter start-up free of torch imports for processes that never use torch_xla.
    """

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    def find_distributions(self, context: Any = None) -> list[importlib.metadata.Distribution]:
        # Asking for the package's version is no import: it does not start the simulation.
        return _simulated_distributions(context)

    def find_spec(self, fullname: str, path: Any = None, target: ModuleType | None = None):
        if not _is_simulated(fullname):
            return None
        with _lock:
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            if not _entries:
                config = dict(self.config)
                pjrt_device = config.pop("pjrt_device", None)
                # The slice variables are read now, not at interpreter start: a multislice job's
                # MEGASCALE_* variables may be set after start-up (Ray Train's backend sets them
                # on its workers before they import torch_xla).
                slices = _slices_from_env(os.environ)
                config.update(num_slices=slices[0], slice_index=slices[1])
                process_wide = simulate(**config)
                process_wide.thread = None  # the process's own slice: every thread uses it
                runtime = process_wide.__enter__()
                if pjrt_device:
                    # Started with PJRT_DEVICE set, as a program on a TPU VM can be: its
                    # torch_xla makes that client (PJRT_DEVICE=CPU: CPU_NUM_DEVICES host
                    # devices), not the TPU one a VM picks when nothing is set.
                    os.environ["PJRT_DEVICE"] = pjrt_device
                if os.environ.get(REPORT_ENV):
                    _report_at_exit(runtime)
        return _FINDER.find_spec(fullname, path, target)


def _report_at_exit(runtime: Any) -> None:
    # Deferred: rich and the report load only in a process that prints it (`xlasim run
    # --compiler`), not at every interpreter start-up.
    from xlasim.reports.compile_report import print_at_exit

    atexit.register(print_at_exit, runtime)


_FINDER = _SimFinder()
_entries: list[Any] = []
_stashed_modules: dict[str, ModuleType] = {}


def _session() -> ModuleType:
    # Imported at the first entry: xlasim itself is imported at interpreter start (xlasim.pth)
    # and by every pytest session (the plugin), and neither may pay for importing torch.
    from xlasim.runtime import session

    return session


def _swap_in(spec: SliceSpec) -> None:
    if real_torch_xla_loaded():
        raise RuntimeError(
            "xlasim cannot simulate torch_xla in a process where the real torch_xla runtime "
            "is already loaded (its SPMD mode and device state are process-global); run the "
            "simulation in a fresh process, e.g. `xlasim run -- python ...`"
        )
    _session().attach_device(spec)
    _stashed_modules.clear()
    for name in [n for n in sys.modules if _is_simulated(n)]:
        _stashed_modules[name] = sys.modules.pop(name)
    sys.meta_path.insert(0, _FINDER)


def _restore_torch_gru() -> None:
    # Importing the simulated torch_xla puts its scan-based GRU in torch.nn.GRU's place, as
    # torch_xla does; outside the simulation torch's own comes back (the simulated class needs
    # the simulated modules).
    nn = sys.modules.get("torch.nn")
    gru = getattr(nn, "GRU", None)
    if getattr(gru, "__module__", "") == "torch_xla.experimental.gru":
        nn.GRU = gru._orig  # type: ignore[union-attr]


def _swap_out() -> None:
    _restore_torch_gru()
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    for name in [n for n in sys.modules if _is_simulated(n)]:
        del sys.modules[name]
    sys.modules.update(_stashed_modules)
    _stashed_modules.clear()
    _session().detach_device()


class simulate:  # noqa: N801 - used like a function: `with xlasim.simulate(...)`
    """Runs code against a simulated TPU slice.

    Usable as a context manager or a decorator; each entry gets a fresh simulated runtime
    (metrics, compiled graphs, SPMD mode, global mesh) and nested entries stack: an inner
    entry is like a separate process, and tensors cannot cross between entries.

    On a multi-host slice this process is host ``host_index``, and data entering the devices
    from the other hosts comes from their processes (``xlasim run`` starts them).  With
    ``single_process=True`` this process stands for them all instead: every other host enters
    the same data into its devices as this one does (docs/multi-host.md).

    Args:
        topology: the chip grid, e.g. ``'2x2'`` or ``'2x2x2'``.
        accelerator: the TPU generation (default ``'v6e'``, which takes 2-D topologies).
        host_index: which host of the slice this process is.
        spmd: start in SPMD mode, as if the program had called ``xr.use_spmd()`` first.
        single_process: this process stands for every host of the slice.
        compiler: ``"libtpu"`` also compiles every graph the simulator counts as an uncached
            compile with the real TPU compiler for this slice (the ``tpu-compiler`` extra; see
            docs/will-it-fit.md); ``None``: from ``XLASIM_COMPILER``.
        dry_run: ``True`` runs on shapes only, computing no values; ``None``: from
            ``XLASIM_DRY_RUN``.
        num_slices: slices of ``topology`` joined over DCN (a multislice job; each slice has
            the topology's hosts and chips, device ids run slice by slice).
        slice_index: which slice this process's host belongs to.
    """

    def __init__(
        self,
        topology: str = "2x2",
        accelerator: str | None = None,
        host_index: int = 0,
        spmd: bool = False,
        single_process: bool = False,
        *,
        compiler: str | None = None,
        dry_run: bool | None = None,
        num_slices: int = 1,
        slice_index: int = 0,
    ) -> None:
        self.spec = parse_slice(topology, accelerator)
        # Validates the host and slice now, before anything (torch included) is loaded.
        tpu_host_env(self.spec, host_index)
        self.num_slices = check_num_slices(num_slices)
        self.slice_index = check_slice_index(slice_index, num_slices)
        for name, flag in (("spmd", spmd), ("single_process", single_process)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be True or False, got {type(flag).__name__} {flag!r}")
        # The simulator's own knobs, checked now so a typo fails here, not at first use.
        check_runtime_knobs()
        self.host_index = host_index
        self.spmd = spmd
        self.single_process = single_process
        self.compiler = resolve_compiler(compiler)
        self.dry_run = resolve_dry_run(dry_run)
        self._runtimes: list[Any] = []
        self.thread: threading.Thread | None = threading.current_thread()
        """The thread whose code runs in the simulation (None: the whole process's)."""

    def __enter__(self) -> Any:
        with _lock:
            _check_same_thread(self)
            outermost = not _entries
            if outermost:
                _swap_in(self.spec)
            try:
                runtime = _session().enter(
                    self.spec,
                    self.host_index,
                    self.spmd,
                    self.single_process,
                    compiler=self.compiler,
                    dry_run=self.dry_run,
                    num_slices=self.num_slices,
                    slice_index=self.slice_index,
                )
            except BaseException:
                if outermost:
                    _swap_out()
                raise
            _entries.append(self)
            self._runtimes.append(runtime)
        return runtime

    def __exit__(self, *exc: object) -> None:
        with _lock:
            if not self._runtimes:
                raise RuntimeError(
                    f"xlasim.simulate({self.spec.topology!r}) was exited without being "
                    f"entered (or exited twice); use it as `with xlasim.simulate(...):`"
                )
            _session().leave(self._runtimes.pop())
            _entries.remove(self)
            if not _entries:
                _swap_out()

    def __call__(self, func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


def _check_same_thread(entry: simulate) -> None:
    """A process has one torch_xla runtime: simulations nest within one thread, never overlap
    from two (the inner one would swap the runtime under the other thread's code)."""
    entry.thread = threading.current_thread() if entry.thread is not None else None
    for held in _entries:
        owner = held.thread
        if owner is not None and owner is not entry.thread and owner.is_alive():
            raise RuntimeError(
                f"xlasim.simulate({entry.spec.topology!r}) entered in thread "
                f"{threading.current_thread().name!r} while thread {owner.name!r} runs in "
                f"xlasim.simulate({held.spec.topology!r}); a process has one torch_xla "
                f"runtime, so simulations nest in one thread only: run the other one after "
                f"it, or in a process of its own (`xlasim run --topology ... -- python ...`)"
            )


def is_active() -> bool:
    return bool(_entries)


def activate_from_env(environ: os._Environ[str] | dict[str, str] = os.environ) -> None:
    """Arranges for this process to import the simulator (``XLASIM_*`` variables).

    Raises :class:`~xlasim.runtime.settings.EnvError` when the variables do not name a valid
    simulated host; nothing is installed then.
    """
    config = config_from_env(environ)
    if config is None:
        return
    sys.meta_path.insert(0, _LazyFinder(config))


ACTIVATION_ENV = ("XLASIM_TOPOLOGY", "XLASIM_ACCELERATOR", "XLASIM_HOST_INDEX")
# Several slices: how many, and which one this host is in.  Unset, they follow the multislice
# variables the host got from Ray or GKE (MEGASCALE_NUM_SLICES, MEGASCALE_SLICE_ID).
NUM_SLICES_ENV = "XLASIM_NUM_SLICES"
SLICE_INDEX_ENV = "XLASIM_SLICE_INDEX"
_SLICE_VARS = ((NUM_SLICES_ENV, "MEGASCALE_NUM_SLICES"), (SLICE_INDEX_ENV, "MEGASCALE_SLICE_ID"))
_SLICE_OWN = (NUM_SLICES_ENV, SLICE_INDEX_ENV)


def config_from_env(environ: Any = os.environ) -> dict[str, Any] | None:
    """``simulate()`` arguments from the activation variables, all checked; None when unset.

    Empty values count as unset (a Ray ``runtime_env`` expands a missing node variable to '').
    ``XLASIM_TOPOLOGY`` set to '' turns the simulation off whatever else is set: that is how a
    job on a simulated cluster runs some workers as plain hosts.
    """
    values = {k: (environ.get(k) or "").strip() for k in (*ACTIVATION_ENV, *_SLICE_OWN)}
    topology, accelerator, host = (values[k] for k in ACTIVATION_ENV)
    if "XLASIM_TOPOLOGY" in environ and not topology:
        return None
    if not topology:
        stray = [f"{k}={v!r}" for k, v in values.items() if v]
        if stray:
            raise EnvError(
                f"{' and '.join(stray)} set without XLASIM_TOPOLOGY: set XLASIM_TOPOLOGY to the "
                f"slice's chip grid (e.g. '2x2x2') to simulate it, or unset "
                f"{' and '.join(s.partition('=')[0] for s in stray)}"
            )
        return None
    host_index = env_int("XLASIM_HOST_INDEX", 0, minimum=0, environ=environ)
    check_runtime_knobs(environ)
    try:
        spec = parse_slice(topology, accelerator or None)
    except ValueError as exc:
        names = "XLASIM_TOPOLOGY" + (" / XLASIM_ACCELERATOR" if accelerator else "")
        raise EnvError(f"{names}: {exc}") from None
    try:
        tpu_host_env(spec, host_index)
    except ValueError as exc:
        raise EnvError(f"XLASIM_HOST_INDEX={host!r}: {exc}") from None
    single = (environ.get(SINGLE_PROCESS_ENV) or "0").strip()
    if single not in ("0", "1"):
        raise EnvError(f"{SINGLE_PROCESS_ENV}={single!r} is not valid: expected 0 or 1")
    num_slices, slice_index = _slices_from_env(environ)
    return {
        "topology": topology,
        "accelerator": accelerator or None,
        "host_index": host_index,
        "single_process": single == "1",
        "num_slices": num_slices,
        "slice_index": slice_index,
        # What the process was started with; empty counts as unset (Ray expands a missing
        # variable to '').
        "pjrt_device": (environ.get("PJRT_DEVICE") or "").strip() or None,
    }


def _slices_from_env(environ: Any) -> tuple[int, int]:
    """(slices, this host's slice) from ``XLASIM_*`` or else the ``MEGASCALE_*`` variables."""
    values: list[int] = []
    for (own, megascale), minimum in zip(_SLICE_VARS, (1, 0), strict=True):
        name = own if (environ.get(own) or "").strip() else megascale
        values.append(env_int(name, minimum, minimum=minimum, environ=environ))
    num_slices, slice_index = values
    try:
        check_slice_index(slice_index, num_slices)
    except ValueError as exc:
        raise EnvError(f"{SLICE_INDEX_ENV} / MEGASCALE_SLICE_ID: {exc}") from None
    return num_slices, slice_index
