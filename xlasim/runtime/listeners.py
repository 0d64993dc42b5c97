"""Stores and gloo devices of the simulated hosts that listen only where the hosts meet.

torch.distributed's ``TCPStore`` server binds the wildcard address (every interface) whatever
host name it is given, and gloo's default device binds whatever this machine's host name
resolves to.  The simulated hosts of a slice run on this machine and meet at an address the
simulator chose (a ``127.0.0.1`` port, see ``xlasim.runtime.ports.loopback_address``), so a
store opened here listens on a socket bound to exactly that address, and gloo binds loopback
when the hosts meet on loopback: nothing of the simulation is reachable from other machines.
"""

from __future__ import annotations

import datetime
import ipaddress
import socket

import torch.distributed as dist


def _bound_socket(host: str, port: int) -> socket.socket:
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        return socket.create_server(sockaddr[:2], family=family)
    except OSError as exc:
        # The error torch raises when its own store cannot listen (callers catch DistError).
        raise dist.DistNetworkError(f"xlasim: cannot listen on {host}:{port}: {exc}") from exc


def store(
    host: str,
    port: int,
    world_size: int,
    *,
    is_master: bool,
    timeout: datetime.timedelta,
    wait_for_workers: bool = True,
) -> dist.TCPStore:
    """A ``TCPStore`` at ``host:port``; the master's server listens on that address only."""
    if not is_master:
        return dist.TCPStore(
            host, port, world_size, is_master=False, timeout=timeout,
            wait_for_workers=wait_for_workers,
        )  # fmt: skip
    # The store owns the listening socket from here on and closes it, also when it fails
    # waiting for the other hosts (so it is not closed here: the number may be reused by then).
    fd = _bound_socket(host, port).detach()
    return dist.TCPStore(
        host, port, world_size, is_master=True, timeout=timeout,
        wait_for_workers=wait_for_workers, master_listen_fd=fd,
    )  # fmt: skip


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def gloo_group(
    store: dist.Store, rank: int, size: int, timeout: datetime.timedelta, meet_at: str
) -> dist.ProcessGroupGloo:
    """A gloo group whose listener is on loopback when the hosts meet on loopback
    (``meet_at``, the store's host); elsewhere gloo's default device."""
    if not is_loopback(meet_at):
        return dist.ProcessGroupGloo(store, rank, size, timeout)
    options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # not in stubs
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=meet_at)]
    options._timeout = timeout
    return dist.ProcessGroupGloo(store, rank, size, options)
