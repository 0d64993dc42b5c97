"""Multi-host SPMD: the simulated hosts of one slice exchanging data over a CPU gloo group.

Each simulated host is its own process holding the *global* value of every device tensor, so
every host runs the same global program and computes the same results, as the hosts of a real
slice do.  The only points where hosts hold different data are where data enters the devices
from a host: a host-local input batch (``minibatch`` input sharding) or a host's own copy of a
tensor it shards.  There the hosts exchange what they hold, and each device's shard is taken
from the copy of the host that owns the device -- exactly what the devices of a real slice end
up holding.

The group is a private ``ProcessGroupGloo`` (the user's default process group is untouched),
joined lazily through a TCPStore at ``XLASIM_HOSTS_ADDR`` ('host:port'; host 0 listens).
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from xlasim.runtime.state import HostLink, SimRuntime

ADDR_ENV = "XLASIM_HOSTS_ADDR"
TIMEOUT_ENV = "XLASIM_HOSTS_TIMEOUT_S"
_DEFAULT_TIMEOUT_S = 300.0


def _parse_addr(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(
            f"{ADDR_ENV}={text!r} is not valid: expected 'host:port', e.g. '127.0.0.1:29555'"
        )
    return host, int(port)


def host_link(rt: SimRuntime) -> HostLink | None:
    """The gloo group of this slice's host processes (None on a single-host slice)."""
    num_hosts = rt.spec.num_hosts
    if num_hosts == 1:
        return None
    if rt.hosts is not None:
        return rt.hosts
    addr = os.environ.get(ADDR_ENV)
    if not addr:
        raise RuntimeError(
            f"xlasim: this process is host {rt.host_index} of a {num_hosts}-host "
            f"{rt.spec.pod_type} slice and needs the other hosts' data here; start one process "
            f"per host with {ADDR_ENV}='host:port' (the same address for all, host 0 listens)"
        )
    host, port = _parse_addr(addr)
    timeout = datetime.timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, _DEFAULT_TIMEOUT_S)))
    store = dist.TCPStore(
        host, port, num_hosts, is_master=rt.host_index == 0, timeout=timeout, wait_for_workers=True
    )
    group = dist.ProcessGroupGloo(
        dist.PrefixStore("xlasim_hosts", store), rt.host_index, num_hosts, timeout
    )
    rt.hosts = HostLink(group, store)
    return rt.hosts


def all_gather(rt: SimRuntime, value: torch.Tensor) -> list[torch.Tensor]:
    """Every host's ``value`` (same shape and dtype on every host), in host order."""
    if rt.dry_run:
        # Shape-only values: every host's copy is alike and no host needs another's.
        return [value] * rt.spec.num_hosts
    link = host_link(rt)
    if link is None:
        return [value]
    group = link.group
    local = value.detach().contiguous()
    shapes_in = torch.tensor(
        [local.dim(), *local.shape, *([0] * (8 - local.dim()))], dtype=torch.int64
    )
    shapes = [torch.empty_like(shapes_in) for _ in range(rt.spec.num_hosts)]
    group.allgather([shapes], [shapes_in]).wait()
    if any(not torch.equal(s, shapes_in) for s in shapes):
        raise RuntimeError(
            "xlasim: the hosts disagree on the shape of a tensor entering the devices: "
            + ", ".join(f"host {h}: {s[1 : 1 + int(s[0])].tolist()}" for h, s in enumerate(shapes))
            + " (on a real slice every host must transfer the same shapes)"
        )
    out = [torch.empty_like(local) for _ in range(rt.spec.num_hosts)]
    group.allgather([out], [local]).wait()
    return out


def owner_host(rt: SimRuntime, device: int) -> int:
    return device // rt.spec.devices_per_host
