"""The processes ``xmp.spawn`` starts on a simulated host (one per chip) and what they exchange.

Each process is a real OS process running the simulator as the one-chip process torch_xla's
launcher configures (``xlasim.runtime.client.chip_process_client``).  The replicas' values
meet in a private gloo group (the user's default process group is untouched) whose store the
launching process holds on a loopback port (``XLASIM_REPLICAS_ADDR``); nothing of it is
reachable from other machines.  A collective is one gather of every replica's value through
that group, done when the op runs: every replica runs the same program, so they meet in the
same order as the collectives of a real slice do.

Bounds: joining the group and every exchange wait at most ``XLASIM_HOSTS_TIMEOUT_S``; after one
process fails, the launcher waits that long for the others before it ends them.
"""

from __future__ import annotations

import concurrent.futures.process as _futures_process
import datetime
import multiprocessing.connection
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.library import custom_op

from xlasim.runtime import listeners, state
from xlasim.runtime.hosts import hosts_timeout_s, stdout_discarded
from xlasim.runtime.settings import HOSTS_TIMEOUT_ENV
from xlasim.runtime.state import HostLink, SimRuntime

ADDR_ENV = "XLASIM_REPLICAS_ADDR"
# A header of dtype, rank and sizes (torch tensors have at most 64 dims).
_HEADER_LEN = 2 + 64


def open_store() -> tuple[dist.TCPStore, str]:
    """The launcher's store on a free loopback port, and its 'host:port' for the children."""
    host = "127.0.0.1"
    sock = socket.create_server((host, 0))
    port = sock.getsockname()[1]
    timeout = datetime.timedelta(seconds=hosts_timeout_s())
    # The store owns the listening socket from here on and closes it.
    fd = sock.detach()
    store = dist.TCPStore(
        host, port, None, is_master=True, timeout=timeout,
        wait_for_workers=False, master_listen_fd=fd,
    )  # fmt: skip
    return store, f"{host}:{port}"


def replica_link(rt: SimRuntime) -> HostLink:
    """The gloo group of the processes ``xmp.spawn`` started (joined on first use)."""
    if rt.replicas is not None:
        return rt.replicas
    client = rt.client
    addr = os.environ.get(ADDR_ENV, "")
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise RuntimeError(
            f"xlasim: this process is replica process {client.process_index} of "
            f"{client.num_processes} (one per chip) but was not started by xmp.spawn / "
            f"torch_xla.launch ({ADDR_ENV}={addr!r}), so there are no other replicas to meet"
        )
    timeout_s = hosts_timeout_s()
    timeout = datetime.timedelta(seconds=timeout_s)
    try:
        store = dist.TCPStore(
            host, int(port), None, is_master=False, timeout=timeout, wait_for_workers=False
        )
        with stdout_discarded():
            group = listeners.gloo_group(
                dist.PrefixStore("xlasim_replicas", store),
                client.process_index,
                client.num_processes,
                timeout,
                host,
            )
    except dist.DistError as exc:
        raise TimeoutError(
            f"xlasim: replica process {client.process_index} could not meet the other "
            f"{client.num_processes - 1} at {ADDR_ENV}={addr!r} within "
            f"{HOSTS_TIMEOUT_ENV}={timeout_s:g} s: {exc}"
        ) from exc
    rt.replicas = HostLink(group, store, timeout_s)
    return rt.replicas


def _exchange(link: HostLink, outputs: list[Tensor], value: Tensor) -> None:
    try:
        link.group.allgather([outputs], [value]).wait()
    except RuntimeError as exc:
        raise TimeoutError(
            "xlasim: a collective between the xmp.spawn processes failed (each exchange waits "
            f"at most {HOSTS_TIMEOUT_ENV}={link.timeout_s:g} s; a replica that exited or hangs "
            f"ends it): {exc}"
        ) from exc


_DTYPE_CODES = {dtype: i for i, dtype in enumerate(
    [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int16,
     torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64, torch.complex128]
)}  # fmt: skip


def gather(rt: SimRuntime, value: Tensor) -> Tensor:
    """Every replica process's ``value``, stacked in process order (dim 0)."""
    link = replica_link(rt)
    local = value.detach().contiguous()
    header = torch.tensor(
        [_DTYPE_CODES.get(local.dtype, -1), local.dim(), *local.shape],
        dtype=torch.int64,
    )
    header = torch.cat([header, header.new_zeros(_HEADER_LEN - header.numel())])
    count = rt.client.num_processes
    headers = [torch.empty_like(header) for _ in range(count)]
    _exchange(link, headers, header)
    if any(not torch.equal(h, header) for h in headers):
        described = ", ".join(
            f"replica {i}: shape {h[2 : 2 + int(h[1])].tolist()}" for i, h in enumerate(headers)
        )
        raise RuntimeError(
            "xlasim: the replicas disagree on the shape or dtype of a collective's input "
            f"({described}); on a TPU slice every replica must run the same collective on "
            "the same shapes, or the program hangs"
        )
    # gloo moves no bool tensors: they travel as bytes.
    wire = local.view(torch.uint8) if local.dtype == torch.bool else local
    out = [torch.empty_like(wire) for _ in range(count)]
    _exchange(link, out, wire)
    stacked = torch.stack(out)
    return stacked.view(torch.bool) if local.dtype == torch.bool else stacked


@custom_op("xlasim::replica_all_gather", mutates_args=())
def replica_all_gather(value: Tensor) -> Tensor:
    """Every replica's ``value`` stacked along a new dim 0: the one collective the simulated
    ``xm`` collectives are built from (recorded in the lazy graph like any op)."""
    return gather(state.current(), value)


@replica_all_gather.register_fake
def _(value: Tensor) -> Tensor:
    count = state.current().client.num_processes
    return value.new_empty((count, *value.shape))


# -- launching -------------------------------------------------------------------------------


@dataclass
class _Child:
    rank: int
    process: Any
    conn: Any
    outcome: tuple[str, Any] | None = None
    ended_at: float = field(default=0.0)


def _child_main(target: Callable[[int], Any], rank: int, conn: Any) -> None:
    """A child's body: ``target(rank)``, its result or exception sent back to the launcher."""
    try:
        outcome: tuple[str, Any] = ("ok", target(rank))
        code = 0
    except BaseException as exc:
        # Pickled with its traceback text, which the launcher's copy carries as __cause__
        # (what a concurrent.futures process pool hands back).
        outcome = ("error", _futures_process._ExceptionWithTraceback(exc, exc.__traceback__))  # type: ignore[arg-type]
        code = 1
    conn.send(outcome)
    # Tensors travel in shared memory that the launcher maps while this process lives: stay
    # until it has taken them.
    if conn.poll(hosts_timeout_s()):
        conn.recv()
    conn.close()
    if code:
        raise SystemExit(code)


_env_lock = threading.Lock()


@contextmanager
def _environment(extra: Mapping[str, str]) -> Iterator[None]:
    """``extra`` in ``os.environ`` while children start: a spawned child's interpreter takes its
    environment then, and needs the simulator's variables before it imports anything."""
    with _env_lock:
        saved = {k: os.environ.get(k) for k in extra}
        os.environ.update(extra)
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def run_processes(
    target: Callable[[int], Any], count: int, env: Mapping[str, str], start_method: str
) -> list[Any]:
    """Runs ``target(rank)`` for ranks ``0 .. count - 1``, each in a process of its own, and
    returns their results in rank order.

    A child's exception is raised here (the first one to fail: the others then usually fail
    only because a collective lost it); a child that dies without one raises
    ``BrokenProcessPool`` as torch_xla's process pool does.
    """
    context = torch.multiprocessing.get_context(start_method)
    children: list[_Child] = []
    try:
        with _environment(env):
            for rank in range(count):
                parent_end, child_end = context.Pipe()
                process = context.Process(  # type: ignore[attr-defined]
                    target=_child_main, args=(target, rank, child_end), daemon=False
                )
                process.start()
                child_end.close()
                children.append(_Child(rank, process, parent_end))
        _wait(children)
    finally:
        for child in children:
            if child.process.is_alive():
                child.process.terminate()
            child.process.join(timeout=hosts_timeout_s())
            child.conn.close()
    failed = sorted((c for c in children if c.outcome[0] != "ok"), key=lambda c: c.ended_at)  # type: ignore[index]
    if failed:
        kind, value = failed[0].outcome  # type: ignore[misc]
        if kind == "error":
            raise value
        raise _futures_process.BrokenProcessPool(
            "A process in the process pool was terminated abruptly while the future was "
            "running or pending."
        ) from RuntimeError(value)
    return [c.outcome[1] for c in children]  # type: ignore[index]


def _wait(children: list[_Child]) -> None:
    """Until every child has ended; once one has failed, the rest get ``XLASIM_HOSTS_TIMEOUT_S``."""
    deadline: float | None = None
    while True:
        running = [c for c in children if c.outcome is None]
        if not running:
            return
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready = multiprocessing.connection.wait(
            [c.conn for c in running] + [c.process.sentinel for c in running], timeout
        )
        if not ready and deadline is not None:
            for child in running:
                child.outcome = (
                    "lost",
                    f"replica process {child.rank} still running {HOSTS_TIMEOUT_ENV}="
                    f"{hosts_timeout_s():g} s after another one failed; ended",
                )
                child.ended_at = time.monotonic()
            return
        for child in running:
            if child.conn in ready or child.process.sentinel in ready:
                child.outcome = _outcome(child)
            if child.outcome is not None:
                child.ended_at = time.monotonic()
                if child.outcome[0] != "ok" and deadline is None:
                    deadline = time.monotonic() + hosts_timeout_s()


def _outcome(child: _Child) -> tuple[str, Any] | None:
    """What the child sent, or how it ended without sending; None while it still runs."""
    try:
        if child.conn.poll():
            outcome: tuple[str, Any] = child.conn.recv()
            child.conn.send("taken")
            return outcome
    except (EOFError, OSError):
        pass  # its end of the pipe closed with nothing sent: it is exiting
    else:
        if child.process.is_alive():
            return None
    child.process.join(timeout=hosts_timeout_s())
    return ("lost", f"replica process {child.rank} exited with code {child.process.exitcode}")
