"""Ports for the servers tests start where port 0 will not do: in another process
(which cannot tell us the port it took), a metrics port (0 is "off"), a server
started again on the port it had.

A port is drawn outside the kernel's range of ephemeral ports: any connection made
between the draw and the bind (a server's to PostgreSQL, a client's to another
server) takes its own end from that range, and could take the very port drawn, so
that the server cannot listen there ("address already in use"), least of all a
server restarted on it after a kill."""

from __future__ import annotations

import random
import socket
from pathlib import Path
from typing import Final

_EPHEMERAL: Final = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LINUX_DEFAULT: Final = (32768, 60999)
_LOWEST: Final = 10_000  # below: the well-known and registered ports of real services
_draw = random.Random()
_given: set[int] = set()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range of ephemeral ports (Linux's default where it cannot be read)."""
    try:
        low, high = (int(field) for field in _EPHEMERAL.read_text().split())
    except (OSError, ValueError):
        return _LINUX_DEFAULT
    return low, high


def free_port() -> int:
    """A TCP port on 127.0.0.1 free now, outside the ephemeral range, and not given
    before by this process. Where the range leaves no room, any free port."""
    low, high = ephemeral_range()
    spans = [(a, b) for a, b in ((_LOWEST, low - 1), (high + 1, 65535)) if b - a >= 1000]
    for _ in range(200 if spans else 0):
        first, last = _draw.choice(spans)
        port = _draw.randint(first, last)
        if port in _given:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given.add(port)
        return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
