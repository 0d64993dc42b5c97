"""Free ports on loopback, where everything a simulation on one machine listens on is bound.

Light on purpose (no torch): the ``xlasim run`` launcher picks host 0's address with it before
any host process starts.
"""

from __future__ import annotations

import socket


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def loopback_address() -> str:
    """``127.0.0.1:PORT`` at a free port: where simulated hosts on one machine meet, never
    outside it."""
    return f"127.0.0.1:{free_loopback_port()}"
