"""Simulated ``torch_xla._internal.pjrt``: one process per local chip, as on a TPU VM.

``run_multiprocess`` starts ``tpu.num_local_processes()`` real processes (one per chip of the
simulated host, capped by ``TPU_PROCESS_BOUNDS``); each configures itself as torch_xla's
launcher does (``PJRT_LOCAL_PROCESS_RANK``/``COUNT``, ``tpu.configure_topology``: the chip it
sees, the process bounds, its task id) and is then the one-chip process of the slice with
those ordinals, replicated over every chip.  On the PJRT CPU client torch_xla starts one
process, whose devices each run the function in a thread of that process.
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import torch_xla
import torch_xla._internal.tpu as tpu
import torch_xla.core.xla_env_vars as xenv
import torch_xla.core.xla_model as xm
from torch_xla import runtime

from xlasim.runtime import replicas, state
from xlasim.runtime.settings import COMPILER_ENV, DRY_RUN_ENV

R = TypeVar("R")

_DEVICE_TURN = threading.Lock()
"""Held by the device thread whose ``fn`` runs (see :func:`_run_thread_per_device`)."""


def _merge_replica_results(replica_results: list[tuple[int, R]]) -> dict[int, R]:
    """``{ordinal: result}``; two results for one ordinal is torch_xla's AssertionError."""
    counts = collections.Counter(ordinal for ordinal, _ in replica_results)
    if counts:
        replica, results = counts.most_common(1)[0]
        assert results == 1, f"{results} results for replica {replica}"
    return dict(replica_results)


def _run_thread_per_device(
    local_rank: int,
    local_world_size: int,
    fn: Callable[[], R],
    initializer_fn: Callable[[int, int], None],
) -> dict[int, R]:
    """``fn`` on each addressable device of this process, ``{global ordinal: result}``.

    torch_xla runs ``fn`` in one thread per device, each with that device as its default
    (on the PJRT CPU client with ``CPU_NUM_DEVICES`` > 1). The simulator's threads take turns:
    its runtime serves one thread at a time, and no collective passes between the threads of
    one process in the simulator (they raise NotImplementedError), so none waits on another.
    A simulated spawn process with one device runs ``fn`` in its own thread.
    """
    initializer_fn(local_rank, local_world_size)
    devices = xm.get_xla_supported_devices()

    def on_device(device: str) -> tuple[int, R]:
        with _DEVICE_TURN:
            torch_xla._XLAC._xla_set_default_device(device)
            return runtime.global_ordinal(), fn()

    if len(devices) == 1:
        return dict([on_device(devices[0])])
    rt = state.current()
    rt.device_threads = len(devices)
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(devices)) as pool:
            return _merge_replica_results(list(pool.map(on_device, devices)))
    finally:
        rt.device_threads = 0


def _run_singleprocess(fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
    initialize_singleprocess()
    return fn(*args, **kwargs)


def initialize_singleprocess() -> None:
    os.environ.setdefault(xenv.PJRT_LOCAL_PROCESS_COUNT, "1")
    if runtime.device_type() == "TPU":
        tpu.configure_one_chip_topology()
    xm.set_replication(torch_xla.device(), [])


def initialize_multiprocess(local_rank: int, local_world_size: int) -> None:
    os.environ.setdefault(xenv.PJRT_LOCAL_PROCESS_RANK, str(local_rank))
    os.environ.setdefault(xenv.PJRT_LOCAL_PROCESS_COUNT, str(local_world_size))
    if runtime.device_type() == "TPU":
        tpu.configure_topology(local_rank, local_world_size)
    devices = xm.get_xla_supported_devices()
    xm.set_replication(torch_xla.device(), devices)


def unsimulated_reason() -> str | None:
    """Why the simulator cannot start torch_xla's processes for this host, or None."""
    rt = state.current()
    if runtime.device_type() != "TPU":
        return None  # one process; on the CPU client, one thread per device in it
    if rt.spec.devices_per_chip > 1:
        return (
            f"xlasim does not simulate xmp.spawn on {rt.spec.accelerator}: each process owns "
            f"a chip of {rt.spec.devices_per_chip} devices and torch_xla runs one thread per "
            "device in it; v4, v5e, v5p and v6e (one device per chip) are simulated"
        )
    if rt.num_slices > 1:
        return (
            f"xlasim does not simulate xmp.spawn across slices ({rt.num_slices} slices of "
            f"{rt.spec.pod_type}): the one-chip processes of every slice would have to meet "
            "over DCN; use SPMD with one process per host"
        )
    if rt.spec.num_hosts > 1:
        return (
            f"xlasim does not simulate xmp.spawn on a multi-host slice ({rt.spec.pod_type}, "
            f"{rt.spec.num_hosts} hosts): the one-chip processes of every host would have to "
            "meet across hosts; use a single-host topology, or SPMD with one process per host"
        )
    return None


def _initialize_child(pjrt_device: str | None, local_rank: int, local_world_size: int) -> None:
    """A child inherits the launcher's device type (a simulated process starts as a TPU
    host, so the CPU client's choice is passed on), then configures itself."""
    if pjrt_device:
        os.environ[xenv.PJRT_DEVICE] = pjrt_device
    initialize_multiprocess(local_rank, local_world_size)


def _process_count() -> int:
    """Processes torch_xla starts on this host: one per chip on a TPU host, else one."""
    reason = unsimulated_reason()
    if reason is not None:
        raise NotImplementedError(reason)
    return tpu.num_local_processes() if runtime.device_type() == "TPU" else 1


def _child_environment(addr: str) -> dict[str, str]:
    """What a child needs to start as this simulated host (its interpreter reads it first)."""
    rt = state.current()
    env = {
        "XLASIM_TOPOLOGY": rt.spec.topology,
        "XLASIM_ACCELERATOR": rt.spec.accelerator,
        "XLASIM_HOST_INDEX": str(rt.host_index),
        replicas.ADDR_ENV: addr,
    }
    if rt.dry_run:
        env[DRY_RUN_ENV] = "1"
    if rt.graphs.compiler is not None:
        env[COMPILER_ENV] = "libtpu"
    return env


def run_multiprocess(
    fn: Callable[..., R], *args: Any, start_method: str = "spawn", **kwargs: Any
) -> dict[int, R]:
    """``fn(*args, **kwargs)`` in one process per local chip; ``{global ordinal: result}``."""
    if torch_xla._XLAC._xla_runtime_is_initialized():
        raise RuntimeError(
            "Runtime is already initialized. Do not use the XLA device before calling xmp.spawn."
        )
    num_processes = _process_count()
    store, addr = replicas.open_store()
    try:
        target = functools.partial(
            _run_thread_per_device,
            local_world_size=num_processes,
            fn=functools.partial(fn, *args, **kwargs),
            initializer_fn=functools.partial(_initialize_child, os.environ.get(xenv.PJRT_DEVICE)),
        )
        results = replicas.run_processes(
            target, num_processes, _child_environment(addr), start_method
        )
    finally:
        del store
    return _merge_replica_results([item for result in results for item in result.items()])


class _SpawnFn:
    """A picklable ``fn`` that takes the global ordinal before its arguments."""

    def __init__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.fn = fn
        self.args = args
        self.kwargs = kwargs

    def __call__(self) -> None:
        self.fn(runtime.global_ordinal(), *self.args, **self.kwargs)


def spawn(
    fn: Callable[..., Any],
    nprocs: int | None = None,
    start_method: str = "spawn",
    args: tuple[Any, ...] = (),
) -> None:
    spawn_fn = _SpawnFn(fn, *args)
    if nprocs == 1:
        return _run_singleprocess(spawn_fn)
    if nprocs is not None:
        raise ValueError(
            f"Unsupported nprocs ({nprocs}). Please use nprocs=1 or None (default). If None, "
            "spawn will use all available devices. Use the environment variable X_NUM_DEVICES "
            "(where X is CPU, TPU, NEURONCORE, etc) to limit the number of devices used."
        )
    run_multiprocess(spawn_fn, start_method=start_method)
    return None


def _initialize_single_process(local_rank: int, local_world_size: int) -> None:
    os.environ.setdefault(xenv.PJRT_LOCAL_PROCESS_RANK, str(local_rank))
    os.environ.setdefault(xenv.PJRT_LOCAL_PROCESS_COUNT, str(local_world_size))


def spawn_threads(fn: Callable[..., Any], args: tuple[Any, ...] = ()) -> None:
    """``fn(ordinal, *args)`` in this process on each of its devices: torch_xla runs one thread
    per addressable device; a process with one device (the CPU client with
    ``CPU_NUM_DEVICES=1``) is simulated, more raise NotImplementedError."""
    _run_thread_per_device(
        local_rank=0,
        local_world_size=1,
        fn=_SpawnFn(fn, *args),
        initializer_fn=_initialize_single_process,
    )
