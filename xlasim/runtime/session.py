"""Entering and leaving a simulated runtime: the torch side of ``xlasim.simulate()``.

The outermost simulation of a process attaches the simulated ``xla`` device to torch (device
guard, factory kernels, the autocast policy) and checks that autograd can still use it; when the
last one is left the kernels are removed again, so a process that loads the real torch_xla later
finds stock torch.  Every entry runs on a fresh :class:`SimRuntime`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from collections.abc import Iterator

import torch

from tpu_backend.topology import SliceSpec, megascale_env
from xlasim.runtime import autocast, graph, state, tpu_device
from xlasim.runtime.client import Client, cpu_client, tpu_client
from xlasim.runtime.device import check_autograd_engine, ensure_device_guard, release_graph_tasks
from xlasim.runtime.dry_run import ShapeOnlyFactories
from xlasim.runtime.graph_dump import GraphDump
from xlasim.runtime.settings import LIBTPU
from xlasim.runtime.tensor import FACTORY_KERNELS, device_indices, wrap_data, xla_device

_autograd_checked = False
# The factory redirection of each active dry-run runtime, by id (entered and left with it).
_dry_run_modes: dict[int, ShapeOnlyFactories] = {}


def attach_device(spec: SliceSpec) -> None:
    """Routes ``xla`` tensors to the simulator (outermost entry); see :func:`detach_device`."""
    ensure_device_guard()
    FACTORY_KERNELS.register()
    # torch_xla registers its autocast policy when it is loaded; a simulation does on entry.
    autocast.install()
    if _check_autograd_at_start not in state.START_HOOKS:
        state.START_HOOKS.append(_check_autograd_at_start)


def attach_tpu(runtime: state.SimRuntime) -> None:
    """TorchTPU's ``tpu`` device joins the simulation (a simulated ``torch_tpu`` loads). It
    shares autograd's device threads with the ``xla`` device (the engine keeps one per device
    index), so the same one-time check and exit-time drain cover it."""
    global _tpu_attached
    spec = runtime.spec
    tpu_device.attach(
        spec.hbm_bytes_per_chip // spec.devices_per_chip,
        runtime.memory.enforcing(),
        emulate_matmuls=runtime.numerics != "exact" and not runtime.dry_run,
    )
    autocast.install("tpu")
    # TorchTPU's autocast dtype is bfloat16 (its device module's default); torch's default for
    # PrivateUse1 is float16. Set for the thread that loads it, as torch keeps it per thread.
    torch.set_autocast_dtype("tpu", torch.bfloat16)
    _tpu_attached = True
    _check_autograd_at_start(runtime)


_tpu_attached = False


def detach_device() -> None:
    FACTORY_KERNELS.unregister()
    autocast.uninstall()
    # TorchTPU's device (attached when a simulated torch_tpu loads) has no devices outside.
    tpu_device.detach()


@contextlib.contextmanager
def _scratch_runtime(spec: SliceSpec, client: Client | None = None) -> Iterator[None]:
    """A throwaway runtime for the simulator's own backward passes, so that no state leaks
    (a TPU host of ``spec`` unless ``client`` is given)."""
    scratch = state.SimRuntime(spec)
    scratch.start(client or tpu_client(spec, 0))
    state.push(scratch)
    try:
        yield
    finally:
        state.pop(scratch)


_autograd_checking = False


def _check_autograd_at_start(runtime: state.SimRuntime) -> None:
    """The autograd check, at a runtime's first device use rather than on entry: its backward
    pass starts autograd's device threads, after which a forked child can run none (PyTorch's
    rule), and a process that forks its replicas (``xmp.spawn(start_method='fork')``) must not
    have used a device, as on a TPU VM."""
    global _autograd_checking
    if _autograd_checked or _autograd_checking:
        return
    _autograd_checking = True
    # In a thread of its own: the first device use may come from inside an op's dispatch,
    # where this thread's autograd is switched off; a new thread starts with it on.
    failure: list[BaseException] = []

    def check() -> None:
        try:
            _check_autograd(runtime.spec)
        except BaseException as exc:
            failure.append(exc)

    try:
        checker = threading.Thread(target=check, name="xlasim-autograd-check")
        checker.start()
        checker.join()
    finally:
        _autograd_checking = False
    if failure:
        raise failure[0]


def _check_autograd(spec: SliceSpec) -> None:
    """The one-time autograd check; also arranges a safe exit after backward passes."""
    global _autograd_checked
    if _autograd_checked:
        return
    with _scratch_runtime(spec):
        check_autograd_engine(lambda: wrap_data(torch.zeros(1), None))
    _autograd_checked = True
    atexit.register(_release_graph_tasks_at_exit, spec, os.getpid())


def _release_graph_tasks_at_exit(spec: SliceSpec, pid: int) -> None:
    """Makes interpreter exit safe after backward passes on ``xla`` (and ``tpu``) tensors.

    The autograd device threads that ran them may still hold a finished graph task whose
    release needs the GIL, which aborts the process once shutdown has begun; see
    :func:`xlasim.runtime.device.release_graph_tasks`.
    """
    if os.getpid() != pid:
        return  # a forked child: the device threads stayed in the parent
    indices = device_indices()
    if _tpu_attached and 0 not in indices:
        indices = [0, *indices]  # the thread that ran tpu:0's backward passes
    # The program may have run on a PJRT CPU client with more devices than a TPU host has: the
    # scratch runtime's client has every device a backward pass used.
    client = cpu_client(max(indices, default=0) + 1)
    try:
        with _scratch_runtime(spec, client):
            release_graph_tasks(lambda index: wrap_data(torch.zeros(1), xla_device(index)), indices)
    except Exception as exc:  # exit goes on; say why it may not be clean
        print(
            f"xlasim: could not wait for autograd's device threads at exit: {exc!r}",
            file=sys.stderr,
        )


def enter(
    spec: SliceSpec,
    host_index: int,
    spmd: bool = False,
    single_process: bool = False,
    *,
    compiler: str | None = None,
    dry_run: bool = False,
    num_slices: int = 1,
    slice_index: int = 0,
) -> state.SimRuntime:
    """Makes a fresh runtime for host ``host_index`` the active one.

    A nested runtime is a process of its own: it starts from the torch_xla variables the
    process had before the outermost simulation (not with the SPMD mode or cache the outer
    program set); leaving it puts the outer one's back.  ``compiler`` (checked by
    ``run_options``) attaches the real compiler every graph also goes to; ``dry_run`` makes
    values shape-only, CPU-side factories included.
    """
    runtime = state.SimRuntime(
        spec,
        host_index,
        num_slices,
        slice_index,
        single_process=single_process,
        dry_run=dry_run,
    )
    runtime.graphs.dump = GraphDump(runtime)
    if compiler == LIBTPU:
        # Deferred: the compile layer imports jax, an optional extra that only a simulation
        # asking for the compiler may load.
        from xlasim.runtime.compiler.libtpu import LibtpuCompiler

        runtime.graphs.compiler = LibtpuCompiler(spec, num_slices)
    runtime.save_env()
    outer = state.outermost()
    if outer is not None:
        runtime.restore_env(outer.saved_env)
    # On a TPU VM `import torch_xla` selects PJRT_DEVICE=TPU; so does the simulation.
    os.environ["PJRT_DEVICE"] = "TPU"
    # A multislice job's hosts start with the coordinator variables Ray or GKE give them. The
    # slice count and index are this simulation's; a coordinator address already set (by
    # whoever started the process: Ray, `xlasim run`) is the job's own and is kept.
    for key, value in megascale_env(num_slices, slice_index).items():
        if key in ("MEGASCALE_NUM_SLICES", "MEGASCALE_SLICE_ID"):
            os.environ[key] = value
        else:
            os.environ.setdefault(key, value)
    if spmd:
        os.environ["XLA_USE_SPMD"] = "1"
    state.push(runtime)
    if dry_run:
        mode = _dry_run_modes[id(runtime)] = ShapeOnlyFactories()
        mode.__enter__()
    _follow(runtime)
    return runtime


def leave(runtime: state.SimRuntime) -> None:
    mode = _dry_run_modes.pop(id(runtime), None)
    if mode is not None:
        mode.__exit__(None, None, None)
    state.pop(runtime)
    runtime.restore_env()
    _follow(state.active())


def _follow(runtime: state.SimRuntime | None) -> None:
    """Process-wide switches follow the active runtime: ops keep their arguments for a
    compiler only while one is attached (otherwise the dispatcher pays one flag test)."""
    graph.RECORD_CALLS = runtime is not None and runtime.graphs.compiler is not None
