"""Multi-host SPMD: the simulated hosts of one slice exchanging data over a CPU gloo group.

Each simulated host is its own process holding the *global* value of every device tensor, so
every host runs the same global program and computes the same results, as the hosts of a real
slice do.  The only points where hosts hold different data are where data enters the devices
from a host: a host-local input batch (``minibatch`` input sharding) or a host's own copy of a
tensor it shards.  There the hosts exchange what they hold, and each device's shard is taken
from the copy of the host that owns the device -- exactly what the devices of a real slice end
up holding.

The group is a private ``ProcessGroupGloo`` (the user's default process group is untouched),
joined lazily through a TCPStore at ``XLASIM_HOSTS_ADDR`` ('host:port'; host 0 listens there
and nowhere else, see :mod:`xlasim.runtime.listeners`).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
import threading
import time
from collections.abc import Iterator

import torch
import torch.distributed as dist

from tpu_backend.topology import tpu_host_env
from xlasim.runtime import listeners
from xlasim.runtime.settings import HOSTS_TIMEOUT_ENV, env_float
from xlasim.runtime.state import HostLink, SimRuntime

ADDR_ENV = "XLASIM_HOSTS_ADDR"
TIMEOUT_ENV = HOSTS_TIMEOUT_ENV
_DEFAULT_TIMEOUT_S = 300.0
# A host waiting for the others says so after FIRST_NOTICE_S, then every NOTICE_EVERY_S.
FIRST_NOTICE_S = 10.0
NOTICE_EVERY_S = 30.0


def _parse_addr(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    valid_port = port.isascii() and port.isdigit() and 0 < int(port) < 2**16
    if not sep or not host or not valid_port:
        raise ValueError(
            f"{ADDR_ENV}={text!r} is not valid: expected 'host:port' with a port in 1..65535, "
            f"e.g. '127.0.0.1:29555'"
        )
    return host, int(port)


def hosts_timeout_s() -> float:
    """The bound on joining and on every exchange between hosts (``XLASIM_HOSTS_TIMEOUT_S``)."""
    return env_float(TIMEOUT_ENV, _DEFAULT_TIMEOUT_S)


@contextlib.contextmanager
def stdout_discarded() -> Iterator[None]:
    """torch 2.9's gloo prints "[Gloo] Rank N is connected to M peer ranks..." on fd 1 when a
    group forms: a line no TPU host prints, in the middle of the user's program output."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


@contextlib.contextmanager
def _waiting_said(rt: SimRuntime, addr: str, timeout_s: float) -> Iterator[None]:
    """While the hosts meet: a host whose peers do not come says, on stderr, whom it waits for,
    where, and what bounds the wait -- a silent five-minute wait looks like a hang."""
    num_hosts = rt.client.num_processes
    if rt.client.process_index == 0:
        whom = f"hosts 1..{num_hosts - 1} to connect to it at {ADDR_ENV}={addr!r}"
    else:
        whom = f"host 0 at {ADDR_ENV}={addr!r}"
    met = threading.Event()
    start = time.monotonic()

    def say() -> None:
        wait = FIRST_NOTICE_S
        while not met.wait(wait):
            print(
                f"xlasim: host {rt.client.process_index} of a {num_hosts}-host {_what(rt)} "
                f"has waited {time.monotonic() - start:.0f} s for {whom}; it gives up after "
                f"{TIMEOUT_ENV}={timeout_s:g} s",
                file=sys.stderr,
                flush=True,
            )
            wait = NOTICE_EVERY_S

    notice = threading.Thread(target=say, name="xlasim-hosts-wait", daemon=True)
    notice.start()
    try:
        yield
    finally:
        met.set()
        notice.join()


def host_link(rt: SimRuntime) -> HostLink | None:
    """The gloo group of this slice's host processes (None on a single-host slice)."""
    num_hosts = rt.client.num_processes
    if num_hosts == 1:
        return None
    if rt.hosts is not None:
        return rt.hosts
    addr = os.environ.get(ADDR_ENV)
    if not addr:
        raise RuntimeError(
            f"xlasim: this process is host {rt.client.process_index} of a {num_hosts}-host "
            f"{_what(rt)} and needs the other hosts' data here; start one process "
            f"per host with {ADDR_ENV}='host:port' (the same address for all, host 0 listens)"
        )
    host, port = _parse_addr(addr)
    # One group for every host of every slice: slices exchange host-entered data over DCN as
    # a slice's hosts do, and a host's rank is its process index (slice by slice).
    rank = rt.client.process_index
    timeout_s = hosts_timeout_s()
    timeout = datetime.timedelta(seconds=timeout_s)
    try:
        with _waiting_said(rt, addr, timeout_s):
            store = listeners.store(host, port, num_hosts, is_master=rank == 0, timeout=timeout)
            with stdout_discarded():
                group = listeners.gloo_group(
                    dist.PrefixStore("xlasim_hosts", store), rank, num_hosts, timeout, host
                )
    except dist.DistError as exc:
        raise TimeoutError(
            f"xlasim: host {rank} of a {num_hosts}-host {_what(rt)} could not meet the other "
            f"hosts at {ADDR_ENV}={addr!r} within {TIMEOUT_ENV}={timeout_s:g} s: {exc}"
        ) from exc
    rt.hosts = HostLink(group, store, timeout_s)
    return rt.hosts


def _exchange(
    link: HostLink, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor]
) -> None:
    """One allgather among the hosts; a host that is gone or stuck ends it within the bound."""
    try:
        link.group.allgather(outputs, inputs).wait()
    except RuntimeError as exc:
        raise TimeoutError(
            "xlasim: exchanging host-entered data with the other hosts failed (each exchange "
            f"waits at most {TIMEOUT_ENV}={link.timeout_s:g} s; a host that exited or "
            f"hangs ends it): {exc}"
        ) from exc


def all_gather(rt: SimRuntime, value: torch.Tensor) -> list[torch.Tensor]:
    """Every host's ``value`` (same shape and dtype on every host), in host order."""
    if rt.single_process or rt.dry_run:
        # One process for all hosts, or shape-only values (every host's copy is alike and no
        # host needs another's).
        return [value] * rt.client.num_processes
    link = host_link(rt)
    if link is None:
        return [value]
    local = value.detach().contiguous()
    shapes_in = torch.tensor(
        [local.dim(), *local.shape, *([0] * (8 - local.dim()))], dtype=torch.int64
    )
    shapes = [torch.empty_like(shapes_in) for _ in range(rt.client.num_processes)]
    _exchange(link, [shapes], [shapes_in])
    if any(not torch.equal(s, shapes_in) for s in shapes):
        raise RuntimeError(
            "xlasim: the hosts disagree on the shape of a tensor entering the devices: "
            + ", ".join(f"host {h}: {s[1 : 1 + int(s[0])].tolist()}" for h, s in enumerate(shapes))
            + " (on a real slice every host must transfer the same shapes)"
        )
    out = [torch.empty_like(local) for _ in range(rt.client.num_processes)]
    _exchange(link, [out], [local])
    return out


def all_gather_ordinals(rt: SimRuntime, ordinals: list[int]) -> list[list[int]]:
    """Every host's local device ordinals, in host order; in a single process each absent
    host's are this host's, moved to that host's devices."""
    if rt.single_process:
        per_host = rt.spec.devices_per_host
        me = rt.client.process_index
        shift = [(h - me) * per_host for h in range(rt.client.num_processes)]
        return [[o + s for o in ordinals] for s in shift]
    gathered = all_gather(rt, torch.tensor(ordinals, dtype=torch.int64))
    return [[int(o) for o in host] for host in gathered]


def _what(rt: SimRuntime) -> str:
    if rt.num_slices > 1:
        return f"{rt.num_slices}-slice {rt.spec.pod_type} job"
    return f"{rt.spec.pod_type} slice"


def owner_host(rt: SimRuntime, device: int) -> int:
    return device // rt.client.num_local


def tpu_vm_metadata(rt: SimRuntime) -> dict[str, str]:
    """The ``tpu-env`` attribute the TPU VM metadata server serves to this simulated host.

    torch_xla asks the metadata server when ``TPU_SKIP_MDS_QUERY`` is unset; a simulated host
    answers with what its slice's TPU environment says (as strings, as the YAML has them).
    """
    env = tpu_host_env(rt.spec, rt.host_index)
    return {
        "ACCELERATOR_TYPE": env["TPU_ACCELERATOR_TYPE"],
        "TPU_PROCESS_BOUNDS": env["TPU_HOST_BOUNDS"],
        "TPU_CHIPS_PER_PROCESS_BOUNDS": env["TPU_CHIPS_PER_HOST_BOUNDS"],
        "WORKER_ID": env["TPU_WORKER_ID"],
    }


def tpu_vm_worker_addresses(rt: SimRuntime) -> list[str]:
    """The slice's worker addresses in worker-id order (``worker-network-endpoints``): the
    simulated hosts all run on this machine."""
    return tpu_host_env(rt.spec, rt.host_index)["TPU_WORKER_HOSTNAMES"].split(",")
