"""The TCP sockets a process listens on, read from Linux's /proc (no extra dependency), and a
free loopback port for a test's own listener."""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path


def _addr(hex_addr: str) -> tuple[str, int]:
    ip_hex, port_hex = hex_addr.split(":")
    raw = bytes.fromhex(ip_hex)
    # /proc prints the address as host-order 32-bit words
    words = [raw[i : i + 4][::-1] for i in range(0, len(raw), 4)]
    return str(ipaddress.ip_address(b"".join(words))), int(port_hex, 16)


def _listening_inodes(pid: int) -> dict[int, tuple[str, int]]:
    found: dict[int, tuple[str, int]] = {}
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # TCP_LISTEN
                found[int(fields[9])] = _addr(fields[1])
    return found


def listening(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket ``pid`` holds open in the LISTEN state."""
    tables = _listening_inodes(pid)
    out = []
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(fd_dir / fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inode = int(target[len("socket:[") : -1])
            if inode in tables:
                out.append(tables[inode])
    return sorted(out)


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def free_port() -> int:
    """A loopback port nothing listens on now (the OS may hand it out again later)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
