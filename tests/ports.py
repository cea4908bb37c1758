"""Free TCP ports on loopback, for servers that must be told theirs (redis-server,
a relay process whose config names it)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nobody listens on now (bound and released: another process may
    take it in the meantime, which tests on one machine accept)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
